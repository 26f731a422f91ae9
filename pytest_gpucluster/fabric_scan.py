"""``gpucluster fabric scan``: the whole InfiniBand fabric, switch ports included, judged from any
node with access to it (docs/how-to/ib-fabric.md).

It runs the standard subnet tools (argv lists, never a shell): ``ibnetdiscover`` (nodes and
cables), ``iblinkinfo --line`` (every port's state), ``ibqueryerrors`` with a threshold file of
zeros (every non-zero error counter of every port) and ``sminfo`` (the master SM); builds a
:class:`~.parsers.ib_fabric.FabricModel` and judges it with :mod:`~.checks.ib_fabric`. ``--out DIR``
keeps ``fabric.json`` (the model and the findings: the next scan's ``--since``) and each tool's
text (``ibnetdiscover.txt`` is the golden topology of an accepted fabric). ``--tool-prefix`` runs
the tools under a wrapper (``ibsim-run`` on a simulated fabric, ``sudo``).

Exit status: 0 clean, 1 findings (one line each, both ends of the cable and what to replace),
2 could not scan (a tool missing, no permission on the management device, a tool that failed).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_gpucluster.checks.ib_fabric import (
    FabricFinding,
    judge_counters,
    judge_links,
    judge_rails,
    judge_shape,
    judge_sm,
    judge_topology,
)
from pytest_gpucluster.errors import GpuClusterError, ParseError
from pytest_gpucluster.parsers.fabric_diff import COUNTER_CLASSES
from pytest_gpucluster.parsers.ib_fabric import FabricModel, build_fabric
from pytest_gpucluster.parsers.ib_tools import PERFQUERY_NAMES

__all__ = ["ScanError", "ScanSettings", "add_fabric_command", "judge", "scan", "settings_from_profile"]

TOOLS = ("ibnetdiscover", "iblinkinfo", "ibqueryerrors", "sminfo")
_PACKAGE = "infiniband-diags"


class ScanError(GpuClusterError):
    """The fabric could not be read: names the tool and why."""


@dataclass(frozen=True, slots=True)
class ScanSettings:
    """What the scan holds the fabric to (the profile's ``fabric.ib`` and ``fabric`` counter keys)."""

    link_width: int | None = None
    link_speed: str | None = None
    rails: int | None = None
    rail_optimized: bool = False
    max_error_increase: int = 0
    allowed_increase: dict[str, int] = field(default_factory=dict)
    max_drop_increase: int | None = None
    saturated: str = "fail"


@dataclass(frozen=True, slots=True)
class ScanOutputs:
    texts: dict[str, str]
    seconds: dict[str, float]


def settings_from_profile(name: str) -> ScanSettings:
    from pytest_gpucluster.profiles.loader import load_profile

    return settings_of(load_profile(name).model)


def settings_of(model: Any) -> ScanSettings:
    """The scan's settings from a loaded profile model (``fabric.ib``, ``fabric``, ``cluster``)."""
    ib, fab = model.fabric.ib, model.fabric
    return ScanSettings(
        link_width=ib.link_width, link_speed=ib.link_speed,
        rails=ib.rails or getattr(model.cluster, "nics_per_node", None) or None,
        rail_optimized=ib.topology == "rail-optimized", max_error_increase=fab.max_error_increase,
        allowed_increase=dict(fab.allowed_increase), max_drop_increase=fab.max_drop_increase, saturated=fab.saturated,
    )  # fmt: skip


def _thresholds() -> str:
    """ibqueryerrors reports a counter above its threshold: zero for every error counter."""
    names = [tool for tool, ours in PERFQUERY_NAMES.items() if COUNTER_CLASSES.get(ours) in ("link", "drop")]
    return "".join(f"{n}=0\n" for n in names)


def _run(prefix: Sequence[str], argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    tool = argv[0]
    try:
        done = subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise ScanError(
            f"{exc.filename or tool} not found: install {_PACKAGE} (and the tool prefix)"
        ) from exc
    except PermissionError as exc:
        raise ScanError(f"cannot run {exc.filename or tool}: permission denied") from exc
    except subprocess.TimeoutExpired as exc:
        raise ScanError(f"{tool} did not finish in {timeout:.0f} s") from exc
    text = done.stdout + done.stderr
    if done.returncode in (126, 127):
        raise ScanError(
            f"{tool} not found or not executable under {' '.join(prefix) or 'PATH'}: install {_PACKAGE}"
        )
    if done.returncode != 0 and ("Permission denied" in text or "umad" in text.lower()):
        raise ScanError(
            f"{tool} could not open the InfiniBand management device (/dev/infiniband/umad*): run as root or "
            f"with read-write access to it ({text.strip().splitlines()[-1][:200] if text.strip() else 'no output'})"
        )
    return done


def scan(prefix: Sequence[str] = (), timeout: float = 600.0) -> tuple[FabricModel, ScanOutputs]:
    """Run the four tools and build the fabric model; :class:`ScanError` when the fabric cannot be read."""
    if not prefix:
        missing = [t for t in TOOLS if shutil.which(t) is None]
        if missing:
            raise ScanError(f"not installed: {', '.join(missing)} (Debian/Ubuntu package {_PACKAGE})")
        if not Path("/dev/infiniband").is_dir():
            raise ScanError(
                "no InfiniBand device on this machine (/dev/infiniband is missing): scan from a node on the fabric"
            )
    texts: dict[str, str] = {}
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="gpucluster-fabric-") as tmp:
        thresholds = Path(tmp) / "thresholds"
        thresholds.write_text(_thresholds())
        runs = {
            "ibnetdiscover": ["ibnetdiscover"],
            "iblinkinfo": ["iblinkinfo", "--line"],
            "ibqueryerrors": ["ibqueryerrors", "--skip-sl", "--threshold-file", str(thresholds)],
            "sminfo": ["sminfo"],
        }
        for name, argv in runs.items():
            start = time.monotonic()
            done = _run(prefix, argv, timeout)
            seconds[name] = time.monotonic() - start
            # No SM is a finding, not a failed scan; ibqueryerrors exits 1 when it lists a port.
            failed = done.returncode != 0 and name != "sminfo"
            if name == "ibqueryerrors" and done.returncode == 1 and "## Summary" in done.stdout:
                failed = False
            if failed:
                tail = (done.stdout + done.stderr).strip()[-300:]
                raise ScanError(f"{' '.join(argv[:2])} exited with {done.returncode}: {tail or 'no output'}")
            texts[name] = done.stdout if name != "sminfo" or done.returncode == 0 else ""
    try:
        model = build_fabric(
            texts["ibnetdiscover"], texts["iblinkinfo"], texts["ibqueryerrors"], texts["sminfo"] or None
        )
    except ParseError as exc:
        raise ScanError(f"could not read the tools' output: {exc}") from exc
    return model, ScanOutputs(texts, seconds)


def judge(
    model: FabricModel,
    settings: ScanSettings,
    golden: FabricModel | None = None,
    since: FabricModel | None = None,
) -> list[FabricFinding]:
    """Every finding of one scan (see :mod:`~.checks.ib_fabric`)."""
    found = judge_links(model, settings.link_width, settings.link_speed)
    found += judge_topology(model, golden) if golden is not None else judge_shape(model, settings.rails)
    if settings.rail_optimized:
        found += judge_rails(model)
    found += judge_sm(model)
    if since is not None:
        found += judge_counters(since, model, settings.max_error_increase, settings.allowed_increase,
                                settings.max_drop_increase, settings.saturated)  # fmt: skip
    return found


TOOL_PREFIX_ENV = "GPUCLUSTER_IB_TOOL_PREFIX"
"""The acceptance suite's fabric scan runs the tools under this command when it is set (``ibsim-run``
on a simulated fabric, ``sudo``); ``off`` turns the scan off."""


def suite_reading(say: Any = print) -> FabricModel | None:
    """The acceptance suite's before/after scan from the controller: the model, or None (said why)
    where this machine cannot reach the fabric (no tools, no access) or ``$GPUCLUSTER_IB_TOOL_PREFIX``
    is ``off``."""
    prefix = os.environ.get(TOOL_PREFIX_ENV, "")
    if prefix.strip() == "off":
        return None
    try:
        model, _ = scan(shlex.split(prefix))
    except ScanError as exc:
        say(f"InfiniBand fabric scan skipped: {exc}")
        return None
    return model


def suite_record(say: Any = print) -> dict[str, Any]:
    """`suite_reading` as the acceptance run hands it from test_fabric_before to later tests
    (``results/handoff.py``, plain JSON): ``{"model": FabricModel.to_json() or None, "why": ...}``,
    ``why`` saying why there is no model (what `suite_reading` said, or the prefix set to ``off``)."""
    said: list[str] = []

    def tell(line: str) -> None:
        said.append(line)
        say(line)

    model = suite_reading(tell)
    if model is not None:
        return {"model": model.to_json(), "why": None}
    why = "; ".join(said) or f"${TOOL_PREFIX_ENV} is off: no InfiniBand scan asked for"
    return {"model": None, "why": why}


def model_of_record(record: Any) -> tuple[FabricModel | None, str | None]:
    """The model of a `suite_record` and why there is none; a damaged record is a `ParseError`."""
    if not isinstance(record, dict) or "model" not in record:
        raise ParseError(f"the fabric before-scan's record is not one suite_record wrote: {record!r:.200}")
    data = record["model"]
    if data is None:
        return None, str(record.get("why") or "no reason recorded")
    return FabricModel.from_json(data, where="the fabric before-scan's record"), None


def suite_checks(before: FabricModel | None, hw: Any, say: Any = print) -> list[Any]:
    """The fabric-wide checks of the acceptance run: a second scan judged against ``before``
    (counters on every port, switch ports included) and on its own (widths, speeds, shape, rails, SM).
    No checks where there was no first scan."""
    if before is None:
        return []
    after = suite_reading(say)
    if after is None:
        return []
    from pytest_gpucluster.checks.ib_fabric import findings_checks

    return findings_checks(judge(after, settings_of(hw), since=before), getattr(hw, "name", None))


def _load_since(path: Path) -> FabricModel:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ScanError(f"--since {path}: cannot read it ({exc})") from exc
    return FabricModel.from_json(data.get("model", {}), where=str(path))


def cmd_fabric_scan(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_profile(args.hw) if args.hw else ScanSettings()
        if args.rail_optimized:
            settings = ScanSettings(**{**_fields(settings), "rail_optimized": True})
        golden = build_fabric(Path(args.expect_topology).read_text()) if args.expect_topology else None
        since = _load_since(Path(args.since)) if args.since else None
        model, outputs = scan(shlex.split(args.tool_prefix or ""), args.timeout)
    except (ScanError, OSError, ParseError) as exc:
        print(f"fabric scan: could not scan: {exc}", file=sys.stderr)
        return 2
    findings = judge(model, settings, golden, since)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in outputs.texts.items():
            (out / f"{name}.txt").write_text(text)
        doc: dict[str, Any] = {
            "model": model.to_json(), "findings": [f.to_json() for f in findings],
            "scanned_at": time.time(), "seconds": outputs.seconds, "golden": args.expect_topology, "since": args.since,
        }  # fmt: skip
        tmp = out / "fabric.json.tmp"
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(out / "fabric.json")
    cas = sum(1 for n in model.nodes.values() if n.kind == "ca")
    print(f"fabric scan: {len(model.nodes) - cas} switches, {cas} HCAs, {len(model.links)} cables; "
          f"{len(findings)} finding(s)")  # fmt: skip
    for finding in findings:
        print(f"  {finding.line()}")
    return 1 if findings else 0


def _fields(settings: ScanSettings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in ScanSettings.__dataclass_fields__}


def add_fabric_command(sub: Any) -> None:
    """Register ``gpucluster fabric scan``."""
    fabric = sub.add_parser("fabric", help="the InfiniBand fabric as a whole (`fabric scan`)")
    actions = fabric.add_subparsers(dest="action", required=True)
    p = actions.add_parser(
        "scan",
        help="read the whole IB fabric with ibnetdiscover/iblinkinfo/ibqueryerrors/sminfo and judge every cable; "
        "exit 0 clean, 1 findings, 2 could not scan",
    )
    p.add_argument("--hw", help="hardware profile whose fabric.ib (rated link, rails, layout) and fabric counter "
                   "allowances apply")  # fmt: skip
    p.add_argument("--expect-topology", metavar="FILE",
                   help="golden topology: a saved ibnetdiscover of the accepted fabric; every missing, extra or "
                   "moved cable is named")  # fmt: skip
    p.add_argument("--since", metavar="EARLIER/fabric.json",
                   help="an earlier scan's fabric.json: error counters that grew since, on every port")  # fmt: skip
    p.add_argument("--rail-optimized", action="store_true",
                   help="check rail alignment even where the profile does not say rail-optimized")  # fmt: skip
    p.add_argument("--out", metavar="DIR", help="write fabric.json and each tool's output here")
    p.add_argument("--tool-prefix", metavar="ARGV",
                   help="run every tool under this command (split like a shell: 'sudo', 'ibsim-run')")  # fmt: skip
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each tool may take (default 600)")
    p.set_defaults(func=cmd_fabric_scan)
    for register in FABRIC_ACTIONS:
        register(actions)


FABRIC_ACTIONS: list[Any] = []
"""More ``gpucluster fabric`` actions, registered by modules of higher layers (cli.py adds ``localize``)."""
