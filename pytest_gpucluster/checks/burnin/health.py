"""Judging the health job: each rank's and GPU's numbers against the profile's ``burnin:`` section.

The rank side (``workloads/health.py``) measures; this module turns its per-rank values into
checks, one per number and rank (or GPU; the GPU's own checks are ``gpu.py``), each with its
threshold from the profile (None: recorded, not gated) and labels naming the host, rank and GPU,
and into the ECC/XID counter increases between two readings. A check that fails is also a
`Suspect` (:func:`suspect_of`) naming the node, rank and GPU, for the drain list.

XID events that a node's logs do not let the rank read are never taken for "no XID":
:func:`xid_readability_checks` records, per node, where they were read or why they could not
be. A node with no readable source is a warning with the one-line fix (:func:`xid_fix`), not a
failure — a permission is not a sick node — unless the profile sets ``burnin.require_xid_source``,
where it fails as not measured.

Pure: no torch, no pytest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from pytest_gpucluster.burnin.drain import Suspect
from pytest_gpucluster.burnin.stragglers import Sample, value_samples
from pytest_gpucluster.checks.burnin.gpu import gpu_checks
from pytest_gpucluster.checks.burnin.xid_classes import (
    UNKNOWN_ACTION,
    KillWindow,
    XidClass,
    classify_event,
    kill_window_of,
)
from pytest_gpucluster.profiles.schema import BurninSection
from pytest_gpucluster.results.model import Check, Comparison, Spread, ThresholdRef
from pytest_gpucluster.results.text import format_value

__all__ = [
    "CORRECTED",
    "COUNTERS",
    "STATES",
    "application_xids",
    "corrected_checks",
    "counter_increases",
    "cpu_checks",
    "gpu_checks",
    "intra_node_samples",
    "matmul_samples",
    "skip_reasons",
    "skip_sentence",
    "suspect_of",
    "xid_fix",
    "xid_readability_checks",
    "xid_warnings",
]

_EXPECTED = {">=": "at least", "<=": "at most", "==": "exactly"}


def _reading(
    metric: str,
    what: str,
    value: float,
    threshold: float | None,
    unit: str,
    comparison: Comparison,
    ref: ThresholdRef | None,
    where: Mapping[str, Any],
    detail: str = "",
    spread: Spread | None = None,
) -> Check:
    """One number of one rank (or GPU): ``where`` holds host, rank and (on GPUs) gpu; the hint says
    what the number is, of which rank or GPU (``GPU 3 of node7: bf16 matmul``)."""
    who = (
        f"{where['gpu']} of {where['host']}"
        if where.get("gpu")
        else f"rank {where['rank']} on {where['host']}"
    )
    hint = f"{who}: {what}" + (f" ({detail})" if detail else "")
    return Check(
        metric,
        value,
        unit,
        threshold,
        comparison,
        ref if threshold is not None else None,
        labels=where,
        spread=spread,
        hint=hint,
    )


def suspect_of(check: Check) -> Suspect:
    """The rank or GPU a failed health check names, with a sentence of its numbers."""
    labels = check.labels
    threshold = "n/a" if check.threshold is None else format_value(check.threshold, check.unit)
    key = f" ({check.ref.key})" if check.ref else ""
    reason = (
        f"{check.hint} {format_value(check.value, check.unit)}, expected {_EXPECTED[check.comparison]} "
        f"{threshold}{key}"
    )
    return Suspect(
        node=str(labels["host"]),
        rank=labels.get("rank"),
        gpu=labels.get("gpu"),
        kind="gpu" if labels.get("gpu") else "node",
        check="health",
        reason=reason,
        evidence={
            "metric": check.metric,
            "value": check.value,
            "threshold": check.threshold,
            "unit": check.unit,
        },
    )


def _num(value: Mapping[str, Any], *path: str) -> float | None:
    node: Any = value
    for part in path:
        node = node.get(part) if isinstance(node, Mapping) else None
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        return None
    return float(node)


def _by_rank(values: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(values, key=lambda v: int(v["rank"]))


def _key(profile: str, key: str) -> ThresholdRef:
    return ThresholdRef(profile, ("burnin", key))


def cpu_checks(values: Iterable[Mapping[str, Any]], section: BurninSection, profile: str) -> list[Check]:
    """Per rank: CPU float32 matmul FLOP/s and memory copy bandwidth."""
    specs = (
        ("burnin.cpu_matmul", "CPU float32 matmul", ("cpu", "matmul_flops"), "FLOP/s", "min_cpu_matmul"),
        ("burnin.cpu_memory_bandwidth", "host memory copy", ("cpu", "memory_bandwidth"), "B/s", "min_cpu_memory_bandwidth"),
    )  # fmt: skip
    out = []
    for value in _by_rank(values):
        where = {"host": str(value["host"]), "rank": int(value["rank"])}
        for metric, what, path, unit, key in specs:
            number = _num(value, *path)
            if number is not None:
                spans = (value.get(path[0]) or {}).get(f"{path[1]}_spans")
                ok = isinstance(spans, list) and spans and all(isinstance(v, (int, float)) for v in spans)
                spread = Spread.of(spans) if ok else None  # each timed span: the gate's noise
                out.append(
                    _reading(
                        metric, what, number, getattr(section, key), unit, ">=", _key(profile, key), where,
                        spread=spread,
                    )
                )  # fmt: skip
    return out


def skip_reasons(values: Iterable[Mapping[str, Any]], part: str) -> list[str]:
    """The distinct reasons the ranks gave for skipping ``part`` (``gpu``, ``nvml``, ``xid``...)."""
    reasons: list[str] = []
    for value in _by_rank(values):
        reason = (value.get("skipped") or {}).get(part)
        if reason and reason not in reasons:
            reasons.append(reason)
    return reasons


def skip_sentence(values: Iterable[Mapping[str, Any]], *parts: str) -> str:
    """The ranks' reasons for skipping ``parts``, each said once; many alike as one "and N more"."""
    reasons = list(dict.fromkeys(r for part in parts for r in skip_reasons(values, part)))
    return f"{reasons[0]} (and {len(reasons) - 1} more like it)" if len(reasons) > 2 else "; ".join(reasons)


def intra_node_samples(values: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """``host -> intra-node all_reduce busbw`` (every rank of a node reports the same number)."""
    out: dict[str, float] = {}
    for value in _by_rank(values):
        number = _num(value, "intra_node", "busbw")
        if number is not None:
            out.setdefault(str(value["host"]), number)
    return out


def matmul_samples(values: Sequence[Mapping[str, Any]]) -> tuple[str, list[Sample]]:
    """Each rank's best matmul span, on its GPU where it has one, else on its CPU: ``(part, samples)``.
    The best span, because load from elsewhere only ever adds to it."""
    for part in ("gpu", "cpu"):
        samples = value_samples(values, part, "matmul_best_s")
        if samples:
            return part, samples
    return "cpu", []


COUNTERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("uncorrected ECC errors (volatile)", ("ecc_uncorrected_volatile",)),
    ("uncorrected ECC errors (aggregate)", ("ecc_uncorrected_aggregate",)),
    ("retired pages", ("retired_pages",)),
    ("uncorrectable remapped rows", ("remapped_rows", "uncorrectable")),
)
"""ECC policy, gated at zero growth: counters of errors the memory could not correct (NVIDIA's
GPU Memory Error Management guide: an uncorrectable error is a data corruption, and each one
retires a page or remaps a row). Any increase during the run fails, naming the GPU."""

STATES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "a row remap is pending",
        ("remapped_rows", "pending"),
        "reset the GPU (nvidia-smi -r) so the remap takes effect",
    ),
    (
        "row remapping failed",
        ("remapped_rows", "failure"),
        "the bank has no spare row left: the GPU needs replacing (RMA)",
    ),
)
"""ECC policy, gated at zero: states read after the run (NVML ``nvmlDeviceGetRemappedRows``
``isPending``/``failureOccurred``). Set, the GPU fails whatever it was before the run."""

CORRECTED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("corrected ECC errors (volatile)", ("ecc_corrected_volatile",)),
    ("correctable remapped rows", ("remapped_rows", "correctable")),
)
"""ECC policy, recorded: errors the memory corrected, by design (SECDED). Their growth is recorded
per GPU and gated only by the profile's optional ``burnin.max_corrected_ecc_per_hour``."""


def _gpus(values: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    out = {}
    for value in values:
        nvml = value.get("nvml") or {}
        if nvml.get("pci_bus_id"):
            out[(str(value["host"]), str(nvml["pci_bus_id"]))] = value
    return out


def _read_twice(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> Iterator[tuple[str, str, Mapping[str, Any], Mapping[str, Any]]]:
    """``(host, gpu, before, after)`` for each GPU read both times (matched by host and PCI
    address, in that order); ``gpu`` is NVML's name for it, else its address."""
    old = _gpus(before)
    for key, now in sorted(_gpus(after).items()):
        was = old.get(key)
        if was is not None:
            yield key[0], (now.get("nvml") or {}).get("gpu") or key[1], was, now


def _pci_key(address: str) -> tuple[int, int, int] | None:
    """``(domain, bus, device)`` of ``00000000:3B:00.0`` (NVML) or ``0000:3b:00`` (an XID line)."""
    parts = address.strip().lower().split(".")[0].split(":")
    try:
        domain, bus, device = (
            (int(p, 16) for p in parts[-3:]) if len(parts) >= 3 else (0, *(int(p, 16) for p in parts))
        )
    except ValueError:
        return None
    return domain, bus, device


def _xids(values: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    return {str(v["host"]): list(v["xid_events"]) for v in values if isinstance(v.get("xid_events"), list)}


def counter_increases(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[Suspect]:
    """Every GPU whose uncorrectable ECC / retired-page / uncorrectable remapped-row counter grew
    between the two readings, or whose row remap is pending or failed after it, and every new XID
    event of a suspect class (reset, reboot, drain) or not in the table (NVIDIA's catalog, `xid_classes`;
    matched to its GPU by PCI address), as suspects with that action. Warning-class XIDs are
    `application_xids`' warnings; corrected errors are `corrected_checks`'."""
    suspects: list[Suspect] = []
    for host, gpu, was, now in _read_twice(before, after):
        for what, path, action in STATES:
            state = _num(now.get("nvml") or {}, *path)
            if state:
                suspects.append(
                    Suspect(
                        node=host, kind="gpu", gpu=gpu, rank=int(now["rank"]), check="counters",
                        reason=f"{what} after the run: {action}",
                        evidence={"counter": ".".join(path), "after": state},
                    )
                )  # fmt: skip
        for what, path in COUNTERS:
            a, b = _num(was.get("nvml") or {}, *path), _num(now.get("nvml") or {}, *path)
            if a is not None and b is not None and b > a:
                suspects.append(
                    Suspect(
                        node=host, kind="gpu", gpu=gpu, rank=int(now["rank"]), check="counters",
                        reason=f"{what} rose from {a:g} to {b:g} during the run",
                        evidence={"counter": ".".join(path), "before": a, "after": b},
                    )
                )  # fmt: skip
    for host, gpu, event, xid_class in _new_xids(before, after):
        if xid_class is not None and xid_class.warning:
            continue  # the catalog asks nothing of the GPU: `application_xids` warns about it
        said = event.get("line") or f"reported by NVML for PCI {event.get('pci', '')}"
        if xid_class is None:
            why = f"not in the XID table ({UNKNOWN_ACTION}; look it up in NVIDIA's XID catalog)"
            action: str = UNKNOWN_ACTION
        else:
            decoded = f", {xid_class.decoded}" if xid_class.decoded else ""
            why = f"{xid_class.name}{decoded}; NVIDIA's XID catalog: {xid_class.bucket}: {xid_class.advice}"
            action = xid_class.action
        suspects.append(
            Suspect(
                node=host, kind="gpu", gpu=gpu, check="counters",
                reason=f"XID {event.get('xid')} during the run ({why}): {said}",
                evidence={"xid": event.get("xid"), "pci": str(event.get("pci", "")).lower(),
                          "bucket": xid_class.bucket if xid_class else None, "action": action},
            )
        )  # fmt: skip
    return suspects


def _new_xids(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> Iterator[tuple[str, str, Mapping[str, Any], XidClass | None]]:
    """``(host, gpu, event, class)`` for each XID event of the run: in the after-reading's log and
    not in the before-reading's, or heard by the session's NVML listener; matched to its GPU by PCI
    address; classed by NVIDIA's catalog (`xid_classes.classify_event`; None: not in the table)."""
    old_xids = _xids(before)
    new_by_host: dict[str, list[Mapping[str, Any]]] = {}
    for host, events in _xids(after).items():
        if host in old_xids:
            seen = {e.get("line") for e in old_xids[host]}
            new_by_host[host] = [e for e in events if e.get("line") not in seen]
    for host, events in _watched(after).items():
        new_by_host.setdefault(host, events)  # the kernel log, where readable, says the same
    for host, new in new_by_host.items():
        gpu_of = {_pci_key(bus): v for (h, bus), v in _gpus(after).items() if h == host}
        for event in new:
            pci = str(event.get("pci", "")).lower()
            match = gpu_of.get(_pci_key(pci))
            gpu = (match.get("nvml") or {}).get("gpu") if match else f"the GPU at PCI {pci}"
            try:
                xid_class = classify_event(
                    int(event.get("xid")),  # type: ignore[arg-type]
                    event.get("line"),
                    event.get("recovery_action"),
                    event.get("recovery_action_error"),
                )
            except (TypeError, ValueError):
                xid_class = None
            yield host, str(gpu), event, xid_class


_WARNING_CAUSES = {
    "RESTART_APP": "an application's error, not the GPU's",
    "WORKFLOW_XID_45": "an aborted application's teardown (Ctrl-C, SIGKILL, a GPU reset), not the GPU's error",
}
"""Why a warning-class XID outside a kill window is not the GPU's, by catalog bucket (default: the
catalog's advice for the bucket)."""


def application_xids(
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    kills: Sequence[KillWindow] = (),
) -> list[Check]:
    """A recorded check (no threshold: a warning) per warning-class XID of the run (a bucket of NVIDIA's
    catalog that asks nothing of the GPU, `xid_classes.WARNING_BUCKETS`: 13, 31, 43, 45, 63...),
    naming host and GPU; the GPU is not blamed. One
    inside the window of a job the suite itself stopped (``kills``, `xid_classes.kill_windows`) is
    attributed to that kill. Its hint is the warning's sentence."""
    out = []
    for host, gpu, event, xid_class in _new_xids(before, after):
        if xid_class is None or not xid_class.warning:
            continue
        said = event.get("line") or f"reported by NVML for PCI {event.get('pci', '')}"
        window = kill_window_of(event, host, kills)
        cause = (
            f"inside the window of job {window.job}, which the suite stopped (its ranks were killed): "
            "attributed to that kill"
            if window
            else _WARNING_CAUSES.get(
                xid_class.bucket, f"the catalog asks nothing of the GPU ({xid_class.advice})"
            )
        )
        sentence = (
            f"XID {event.get('xid')} on {gpu} of {host} ({xid_class.name}"
            f"{', ' + xid_class.decoded if xid_class.decoded else ''}; NVIDIA's XID catalog: "
            f"{xid_class.bucket}) {cause}. Recorded, the GPU is not blamed: {said}"
        )
        labels = {"host": host, "gpu": gpu, "xid": event.get("xid")}
        if window:
            labels["killed_job"] = window.job
        out.append(Check("burnin.xid_application", 1.0, "events", labels=labels, hint=sentence))
    return out


def corrected_checks(
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    section: BurninSection,
    profile: str,
) -> list[Check]:
    """Per GPU and corrected counter (:data:`CORRECTED`), its growth over the run: recorded, or
    judged as a rate per hour against ``burnin.max_corrected_ecc_per_hour`` where the profile sets
    one (the readings' ``taken_at`` give the hours; without them the rate is not measured)."""
    ceiling = section.max_corrected_ecc_per_hour
    ref = _key(profile, "max_corrected_ecc_per_hour") if ceiling is not None else None
    out: list[Check] = []
    for host, gpu, was, now in _read_twice(before, after):
        where = {"host": host, "gpu": gpu, "rank": int(now["rank"])}
        start, end = _num(was, "taken_at"), _num(now, "taken_at")
        hours = (end - start) / 3600 if start is not None and end is not None and end > start else None
        for what, path in CORRECTED:
            a, b = _num(was.get("nvml") or {}, *path), _num(now.get("nvml") or {}, *path)
            if a is None or b is None:
                continue
            grown = max(b - a, 0.0)
            labels = {**where, "counter": ".".join(path)}
            told = f"{gpu} of {host}: {what} {a:g} -> {b:g} over the run"
            if ceiling is None:
                out.append(Check("burnin.corrected_ecc", grown, "count", labels=labels,
                                 hint=f"{told}; corrected by design, recorded (burnin.max_corrected_ecc_per_hour gates a rate)."))  # fmt: skip
                continue
            rate = grown / hours if hours else math.nan
            span = f"{hours * 60:.3g} min" if hours else "an unknown time (the readings carry no taken_at)"
            out.append(
                Check("burnin.corrected_ecc_rate", rate, "1/h", ceiling, "<=", ref, labels=labels, baseline_gate=False,
                      hint=f"{told} in {span}. Many corrected errors are the usual forerunner of uncorrectable ones: "
                      "watch the GPU, retest it, and drain it if the rate holds.")
            )  # fmt: skip
    return out


def _watched(values: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """``host -> XID events`` of the session-spanning NVML listener (the last reading carries them)."""
    return {
        str(v["host"]): list(v["xid_watch_events"])
        for v in values
        if isinstance(v.get("xid_watch_events"), list)
    }


def _xid_state(values: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str | None, str | None]]:
    """``host -> (source, why)`` from the values of one reading: the node's first rank carries
    ``xid_source`` with ``xid_events`` (the kernel log) or ``xid_watch`` (the session's NVML
    listener, started by the first reading and read by the last), or why neither could be read."""
    out: dict[str, tuple[str | None, str | None]] = {}
    for value in values:
        host = str(value["host"])
        skipped = value.get("skipped") or {}
        if isinstance(value.get("xid_events"), list):
            out[host] = (str(value.get("xid_source") or "the kernel log"), None)
        elif value.get("xid_watch"):
            out[host] = (str(value["xid_watch"]), None)
        elif skipped.get("xid") or skipped.get("xid_watch"):
            why = "; ".join(str(skipped[k]) for k in ("xid", "xid_watch") if skipped.get(k))
            out.setdefault(host, (None, why))
    return out


def xid_fix(user: str | None) -> str:
    """The one line that lets ``user`` read XID events without root: the kernel log's groups
    (``journalctl -k`` needs ``systemd-journal`` or ``adm``, ``/var/log/kern.log`` is ``root:adm``)
    or, for ``dmesg``, the sysctl (Debian, Ubuntu and Fedora kernels set ``kernel.dmesg_restrict=1``)."""
    who = user or "<the test user>"
    return (
        f"sudo usermod -aG adm,systemd-journal {who}  (or: sudo sysctl -w kernel.dmesg_restrict=0; "
        "or run a DCGM host engine, or install nvidia-ml-py so NVML's XID events are listened to)"
    )


def _user(values: Sequence[Mapping[str, Any]], host: str) -> str | None:
    return next((str(v["user"]) for v in values if str(v.get("host")) == host and v.get("user")), None)


def xid_readability_checks(
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    *,
    require: bool = False,
    profile: str = "",
) -> list[Check]:
    """Per node, whether both readings could read its XID events: 1 (where from) or, when either
    could not, a check with no value whose hint says why and the one-line fix. Recorded (no
    threshold: the test warns) unless ``require`` (``burnin.require_xid_source``): then it fails
    as not measured."""
    was, now = _xid_state(before), _xid_state(after)
    out = []
    for host in sorted(set(was) | set(now)):
        readings = [r for r in (was.get(host), now.get(host)) if r is not None]
        why = "; ".join(dict.fromkeys(w for _, w in readings if w))
        if len(readings) < 2 and not why:
            why = f"{host} answered only one of the two readings"
        if not why:
            sources = " and ".join(dict.fromkeys(s for s, _ in readings if s))
            hint = f"XID events of {host} read from {sources} before and after the run."
            out.append(Check("burnin.xid_readable", 1.0, "bool", 1.0, "==", labels={"host": host}, hint=hint))
            continue
        fix = xid_fix(_user([*before, *after], host))
        hint = f"XID events of {host} could not be checked: {why}. Fix: {fix}."
        if require:
            ref = ThresholdRef(profile or "profile", ("burnin", "require_xid_source"))
            out.append(
                Check(
                    "burnin.xid_readable", math.nan, "bool", 1.0, "==", ref, labels={"host": host}, hint=hint
                )
            )
        else:
            out.append(Check("burnin.xid_readable", math.nan, "bool", labels={"host": host}, hint=hint))
    return out


def xid_warnings(checks: Sequence[Check]) -> list[str]:
    """The warning each node whose XIDs went unread gets (the checks of `xid_readability_checks`
    that record no value and do not fail: ``burnin.require_xid_source`` is off)."""
    return [c.hint for c in checks if c.metric == "burnin.xid_readable" and not c.measured and not c.failed]
