"""The ``gpucluster`` command: inspect profiles, parse recorded tool outputs, compare and report.

Each subcommand is a small function; errors the user can fix (bad file, unknown profile, no data)
print one sentence to stderr and exit 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gpucluster.errors import GpuClusterError


@dataclass(frozen=True, slots=True)
class ParserEntry:
    """How ``gpucluster parse KIND FILE`` reaches a parser module (imported only when used)."""

    module: str
    parse: str
    to_json: str
    description: str
    takes_source: bool = False


PARSERS: dict[str, ParserEntry] = {
    "nccl-tests": ParserEntry(
        "pytest_gpucluster.parsers.nccl_tests",
        "parse",
        "runs_as_json",
        "nccl-tests output (all_reduce_perf, ...)",
        True,
    ),
    "nccl-log": ParserEntry(
        "pytest_gpucluster.parsers.nccl_log",
        "parse_nccl_log",
        "to_json",
        "NCCL_DEBUG=INFO log of one or many ranks",
    ),
    "topo": ParserEntry(
        "pytest_gpucluster.parsers.nvidia_topo", "parse_topo_text", "to_json", "nvidia-smi topo -m"
    ),
    "nvlink": ParserEntry(
        "pytest_gpucluster.parsers.nvidia_nvlink",
        "parse_nvlink_captures",
        "captures_to_json",
        "nvidia-smi nvlink -s / -gt d / -gt r; a list, one object per capture (idle, training...)",
    ),
    "ib-ports": ParserEntry(
        "pytest_gpucluster.parsers.ib_tools",
        "parse_fabric",
        "to_json",
        "InfiniBand/RoCE ports: ibstat, ibstatus, ibv_devinfo -v, perfquery, sysfs dumps, fabric_probe JSON",
        True,
    ),
    "dcgm-diag": ParserEntry(
        "pytest_gpucluster.parsers.dcgm_diag",
        "parse_dcgm_diag",
        "to_json",
        "dcgmi diag -r <level> -j (DCGM 2.x/3.x/4.x) or its plain-text table",
        True,
    ),
    "ecc": ParserEntry(
        "pytest_gpucluster.parsers.nvidia_smi_ecc",
        "parse_ecc",
        "to_json",
        "nvidia-smi -q -d ECC, or --query-gpu=ecc.mode.current,ecc.mode.pending CSV",
    ),
    "train-log": ParserEntry(
        "pytest_gpucluster.parsers.train_log",
        "parse_train_log",
        "to_json",
        "HF Trainer / DeepSpeed / Megatron training log",
        True,
    ),
}


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def cmd_profiles(args: argparse.Namespace) -> int:
    from pytest_gpucluster.profiles.loader import known_profiles, load_profile

    dirs = [Path(d) for d in args.thresholds_dir]
    if args.name is None:
        profiles = known_profiles(dirs)
        width = max((len(n) for n in profiles), default=0)
        for name, path in profiles.items():
            try:
                description = load_profile(str(path), dirs).model.description
            except GpuClusterError as exc:
                description = f"INVALID: {str(exc).splitlines()[0]}"
            print(f"{name.ljust(width)}  {description}")
        return 0
    profile = load_profile(args.name, dirs)
    if args.json:
        _print_json(profile.model.model_dump(mode="json"))
        return 0
    import yaml

    print(f"# {profile.model.name}: resolved from {' <- '.join(str(p) for p in profile.chain)}")
    print(f"# sha256 {profile.sha256}; quantities in canonical units (bytes, bytes/s, seconds, FLOP/s)")
    print(yaml.safe_dump(profile.model.model_dump(mode="json"), sort_keys=False).rstrip())
    return 0


def cmd_parse(args: argparse.Namespace) -> int:
    entry = PARSERS[args.kind]
    module = importlib.import_module(entry.module)
    path = Path(args.file)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise GpuClusterError(f"cannot read {path}: {exc.strerror or exc}") from None
    parse = getattr(module, entry.parse)
    try:
        result = parse(text, source=str(path)) if entry.takes_source else parse(text)
    except GpuClusterError as exc:
        message = str(exc)
        raise GpuClusterError(message if str(path) in message else f"{path}: {message}") from None
    _print_json(getattr(module, entry.to_json)(result))
    return 0


def cmd_parse_hostfile(args: argparse.Namespace) -> int:
    from pytest_gpucluster.cluster.hostfile import hostfile_to_json, read_hostfile

    _print_json(hostfile_to_json(read_hostfile(Path(args.file))))
    return 0


def cmd_parse_nodelist(args: argparse.Namespace) -> int:
    from pytest_gpucluster.cluster.nodelist import expand_nodelist

    _print_json(expand_nodelist(args.expr))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pytest_gpucluster.results.baseline import read_results
    from pytest_gpucluster.results.rejudge import rejudge
    from pytest_gpucluster.results.rejudge_drain import rejudge_drain_list
    from pytest_gpucluster.results.report import write_reports

    path = Path(args.results)
    # the verdict is derived again from the evidence (inventory, measurements), not taken as written
    judged = rejudge(read_results(path))
    print(f"gpucluster: {judged.note}", file=sys.stderr)
    out = Path(args.out) if args.out else path.parent
    files = write_reports(judged.run, out)
    for written in files.paths:
        print(written)
    # the drain list an operator script reads (suspects.json) follows the re-judged findings too
    try:
        drain_note = rejudge_drain_list(judged.run, out)
    except OSError as exc:  # a read-only results directory: the report is still written above
        drain_note = f"drain list not re-judged: cannot write beside {out}: {exc} (use --out DIR)"
    if drain_note:
        print(f"gpucluster: {drain_note}", file=sys.stderr)
    if files.note:
        print(f"gpucluster: no plots: {files.note}", file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Judge NEW against OLD as the run that wrote NEW did (its stored tolerances and gate mode),
    unless --max-regression overrides the default tolerance."""
    from dataclasses import replace

    from pytest_gpucluster.results.baseline import compare_runs, read_results, settings_of
    from pytest_gpucluster.results.comparison_text import comparison_lines

    old, new = read_results(Path(args.old)), read_results(Path(args.new))
    tolerances, mode = settings_of(new)
    if args.max_regression is not None:
        tolerances = replace(
            tolerances, default=_fraction("--max-regression", args.max_regression), source="--max-regression"
        )
    comparison = compare_runs(old, new, tolerances, mode=mode)
    for line in comparison_lines(comparison):
        print(line)
    return 1 if comparison.fails else 0


def _fraction(flag: str, text: str) -> float:
    from pytest_gpucluster.profiles.quantities import parse_fraction

    try:
        return parse_fraction(text if "%" in text or float(text) <= 1 else f"{text}%")
    except ValueError:
        raise GpuClusterError(f"{flag} {text!r}: expected a percentage such as 5%") from None


def cmd_baseline_merge(args: argparse.Namespace) -> int:
    from pytest_gpucluster.results.baseline import read_results
    from pytest_gpucluster.results.fleet import merge_runs, write_fleet

    if len(args.results) < 2:
        raise GpuClusterError("baseline merge needs two or more results files (a fleet of one is that run)")
    fleet = merge_runs([read_results(Path(p)) for p in args.results])
    out = Path(args.out)
    if out.exists() and not args.force:
        raise GpuClusterError(f"{out} exists; pass --force to overwrite it")
    write_fleet(fleet, out)
    print(f"{out}: {fleet.summary()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpucluster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    profiles = sub.add_parser(
        "profiles",
        help="list profiles, or show one resolved (after extends:); "
        "also `profiles derive RESULTS.json... --name NAME` and `profiles check FILE...`",
    )
    profiles.add_argument("name", nargs="?", help="profile name or YAML path")
    profiles.add_argument("--thresholds-dir", action="append", default=[], help="extra profile directory")
    profiles.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    profiles.set_defaults(func=cmd_profiles)

    parse = sub.add_parser("parse", help="parse a recorded tool output and print JSON")
    kinds = parse.add_subparsers(dest="kind", required=True)
    for kind, entry in PARSERS.items():
        p = kinds.add_parser(kind, help=entry.description)
        p.add_argument("file")
        p.set_defaults(func=cmd_parse)
    p = kinds.add_parser("hostfile", help="DeepSpeed or Open MPI hostfile")
    p.add_argument("file")
    p.set_defaults(func=cmd_parse_hostfile)
    p = kinds.add_parser("nodelist", help='Slurm nodelist expression such as "node[001-008,010]"')
    p.add_argument("expr")
    p.set_defaults(func=cmd_parse_nodelist)
    report = sub.add_parser(
        "report",
        help="write report.md, report.html and summary.csv from a results.json, its fail-closed verdict "
        "re-judged per node and GPU from the inventory and measurements it records; the drain list "
        "(suspects.json) is rewritten from the re-judged findings (the run's kept as suspects.json.orig; "
        "with --out, a new suspects.json there)",
    )
    report.add_argument("results", metavar="RESULTS.json")
    report.add_argument("--out", metavar="DIR", help="where to write (default: the results file's directory)")
    report.set_defaults(func=cmd_report)

    compare = sub.add_parser(
        "compare", help="compare two results.json; exit 1 on a regression, 2 on unreadable input"
    )
    compare.add_argument("old", metavar="OLD.json", help="the baseline: a results.json or a fleet baseline")
    compare.add_argument("new", metavar="NEW.json")
    compare.add_argument(
        "--max-regression",
        default=None,
        help="default tolerance for metrics the profile's regression: globs do not name "
        "(default: what NEW was run with, else 5%%)",
    )
    compare.set_defaults(func=cmd_compare)

    baseline = sub.add_parser("baseline", help="`baseline merge A.json B.json ... --out FLEET.json`")
    actions = baseline.add_subparsers(dest="action", required=True)
    merge = actions.add_parser(
        "merge",
        help="a fleet baseline: per measurement the median of several runs, its noise the range over them",
    )
    merge.add_argument("results", nargs="+", metavar="RESULTS.json")
    merge.add_argument("--out", "-o", required=True, metavar="FLEET.json")
    merge.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    merge.set_defaults(func=cmd_baseline_merge)

    from pytest_gpucluster.results.history.cli import add_history_command

    add_history_command(sub)
    from pytest_gpucluster.health_check import add_health_check_command

    add_health_check_command(sub)
    from pytest_gpucluster.fabric_scan import FABRIC_ACTIONS, add_fabric_command
    from pytest_gpucluster.results.fabric_localize import add_localize_command

    if add_localize_command not in FABRIC_ACTIONS:
        FABRIC_ACTIONS.append(add_localize_command)
    add_fabric_command(sub)
    for register in EXTRA_COMMANDS:
        register(sub)
    return parser


EXTRA_COMMANDS: list[Callable[[Any], None]] = []
"""Subcommand registrars added by feature modules (report, compare, profiles derive...)."""


PROFILE_COMMANDS = ("derive", "check")
"""Reserved first words after ``profiles``: ``gpucluster profiles derive|check ...``. A profile
file named like one of them is still shown by path: ``gpucluster profiles ./check.yaml``."""


def cmd_profiles_derive(args: argparse.Namespace) -> int:
    from pytest_gpucluster.profiles.derive import derive_files

    derive_files(
        [Path(p) for p in args.results],
        name=args.name,
        margin_text=args.margin,
        from_baseline=args.from_baseline,
        out=Path(args.out) if args.out else None,
        extra_dirs=[Path(d) for d in args.thresholds_dir],
        force=args.force,
    )
    return 0


def cmd_profiles_check(args: argparse.Namespace) -> int:
    """Schema and physics checks of each file, running nothing. Exit 2 if any file is invalid or
    asks for what its hardware cannot do, 1 if any has warnings (or, with --strict, an unsourced
    threshold), 0 when every file is clean."""
    import yaml

    from pytest_gpucluster.profiles.devices import load_devices
    from pytest_gpucluster.profiles.loader import load_profile
    from pytest_gpucluster.profiles.physics import check_profile, peaks_for
    from pytest_gpucluster.profiles.sources import unsourced_thresholds

    dirs = [Path(d) for d in args.thresholds_dir]
    failed = flagged = 0
    for name in args.files:
        try:
            path = Path(name)
            if (
                path.is_file()
                and isinstance(data := yaml.safe_load(path.read_text(encoding="utf-8")), dict)
                and ("devices" in data and "name" not in data)
            ):
                print(f"ok    {name}: device table, {len(load_devices(path))} devices")
                continue
            profile = load_profile(name, dirs)
        except (GpuClusterError, yaml.YAMLError, OSError) as exc:
            failed += 1
            print(f"FAIL  {name}: {exc}", file=sys.stderr)
            continue
        report = check_profile(profile.model)
        match = peaks_for(profile.model).match
        if match is None:
            against = "the profile's own figures"
        else:
            how = "named exactly" if match.exact else "family only: its strongest part"
            against = f"the peaks of {match.device.part} (devices.yaml {match.device.key}; {how})"
        unsourced = unsourced_thresholds(profile.chain) if args.strict else ()
        verdict = "ok   " if not profile.warnings and not unsourced else "WARN "
        flagged += verdict != "ok   "
        print(
            f"{verdict} {name}: schema valid; {report.checked} threshold(s) held against {against}, "
            f"{len(profile.warnings)} warning(s), {len(report.skipped)} not checked"
            + (f", {len(unsourced)} unsourced" if args.strict else "")
        )
        for warning in profile.warnings:
            print(f"      warning: {warning}")
        for item in unsourced:
            print(f"      unsourced: {item}")
        for skipped in report.skipped:
            print(f"      not checked: {skipped}")
    return 2 if failed else (1 if flagged else 0)


def build_profiles_command_parser(word: str) -> argparse.ArgumentParser:
    """The parser of ``gpucluster profiles derive`` / ``gpucluster profiles check``."""
    if word == "derive":
        parser = argparse.ArgumentParser(
            prog="gpucluster profiles derive",
            description="Write a profile whose thresholds are a known-good run's measurements at a margin "
            "(floors below, ceilings above); it extends the run's profile and is validated before writing.",
        )
        parser.add_argument("results", nargs="+", metavar="RESULTS.json")
        parser.add_argument("--name", required=True, help="name of the new profile")
        parser.add_argument("--margin", default="10%", help="distance from the measured value (default 10%%)")
        parser.add_argument(
            "--from-baseline", action="store_true", help="several results files: take the median across runs"
        )
        parser.add_argument("--out", metavar="FILE", help="where to write (default: ./NAME.yaml)")
        parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")
        parser.set_defaults(func=cmd_profiles_derive)
    else:
        parser = argparse.ArgumentParser(
            prog="gpucluster profiles check",
            description="Schema and physics checks of profiles (and of a devices.yaml), running nothing. "
            "Exit 0 when every file is clean, 1 when one has warnings (or, with --strict, a threshold "
            "without a source), 2 when one is invalid or asks for what its hardware cannot do.",
        )
        parser.add_argument("files", nargs="+", metavar="FILE", help="profile paths or names")
        parser.add_argument(
            "--strict",
            action="store_true",
            help="also fail on a threshold that does not say where its number comes from "
            "(a comment on or above its line, or a source: field)",
        )
        parser.set_defaults(func=cmd_profiles_check)
    parser.add_argument("--thresholds-dir", action="append", default=[], help="extra profile directory")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) > 1 and argv[0] == "profiles" and argv[1] in PROFILE_COMMANDS:
        args = build_profiles_command_parser(argv[1]).parse_args(argv[2:])
    else:
        args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except GpuClusterError as exc:
        print(f"gpucluster: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
