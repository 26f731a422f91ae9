"""Burn-in: find the bad node, GPU or link, and say which.

A new batch of nodes often holds a few failing parts, and a slow collective only says "something is
slow". These tests name it:

- **health** (`test_rank_health_cpu`, `test_gpu_health`): one job on every node at once measures each
  rank's CPU matmul and memory bandwidth, and on GPUs each GPU's bf16 matmul, memory and
  host-to-device bandwidth and its NVML readings (temperature, power, PCIe link, throttle reasons,
  retired pages, remapped rows), against the profile's ``burnin:`` section.
- **stragglers** (`test_health_stragglers`, `test_collective_stragglers`): ranks and nodes slower
  than the median of their peers by more than ``burnin.straggler_tolerance``, from each rank's own
  matmul time and from each rank's time outside the collective calls of an all_reduce sweep.
  `test_injected_straggler_is_named` proves the detector on this cluster: one rank is made slow on
  purpose (a workload option that sleeps) and must be named, with its host.
- **ECC / XID** (`test_counters_before`, `test_counters_after`): counters read before the first and
  after the last test of the run (acceptance/conftest.py orders them); any increase fails naming
  the GPU.
- **version drift** (`test_version_drift`): every node's driver, CUDA, NCCL, net plugin, torch and
  firmware versions against the profile's ``versions:`` pins, and against each other.
- **pairwise localization** (`test_pairwise_localization`): the intra-node all_reduce of every node
  (in the health job), then node pairs in two rounds (`burnin.pairwise`). It launches about n/2 + 2
  jobs, so a plain ``pytest acceptance/`` leaves it out; ``-m burnin`` runs it.

Every suspect goes to ``<results dir>/suspects.json`` (node, reason, evidence) as soon as it is
found; at the end of the session the suspects and the ``scontrol update NodeName=... State=DRAIN``
command for each node are printed, and run only with ``--gpucluster-drain``. The self-test's
injected straggler is reported, never drained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_gpucluster.burnin.drain import (
    SUSPECTS_FILE,
    Suspect,
    drain_commands,
    run_drain,
    shell_line,
    write_suspects,
)
from pytest_gpucluster.burnin.drift import (
    check_agreement,
    check_pins,
    nccl_log_fingerprints,
    node_fingerprints,
)
from pytest_gpucluster.burnin.pairwise import localize
from pytest_gpucluster.burnin.runner import ClusterPairRunner
from pytest_gpucluster.burnin.stragglers import (
    Sample,
    Verdict,
    find_stragglers,
    sweep_samples,
    value_samples,
    worst_per_host,
)
from pytest_gpucluster.checks.burnin.health import (
    Reading,
    counter_increases,
    cpu_readings,
    gpu_readings,
    intra_node_samples,
    skip_reasons,
)
from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.launch.result import JobSkipped
from pytest_gpucluster.results.recorder import ThresholdFailure

pytestmark = pytest.mark.burnin

HEALTH = "pytest_gpucluster.workloads.health:health"
COUNTERS = "pytest_gpucluster.workloads.health:counters"
SWEEP = "pytest_gpucluster.workloads.collectives:sweep"
JOB_TIMEOUT_S = 600.0
STRAGGLER_SWEEP = {
    "collective": "all_reduce",
    "min_bytes": "64K",
    "max_bytes": "1M",
    "factor": 4,
    "warmup": 2,
    "iters": 5,
    "repeat": 3,
    "in_place": False,
}
INJECTED_DELAY_S = 0.02
"""The self-test's straggler sleeps this long before each timed call: far above any tolerance."""


# ------------------------------------------------------------------------------ suspects


class Suspects:
    """The session's suspects: written to suspects.json as found, printed (and drained) at the end."""

    def __init__(self, session: Any) -> None:
        self.path = session.results_dir / SUSPECTS_FILE
        self.found: list[Suspect] = []
        write_suspects(self.path, [])  # the file exists from now on: "no suspects" is an answer

    def add(self, suspects: Sequence[Suspect], source: str) -> None:
        named = [dataclasses.replace(s, source=source) for s in suspects]
        self.found += named
        write_suspects(self.path, named)


@pytest.fixture(scope="session")
def burnin_suspects(gpucluster_session, request: pytest.FixtureRequest) -> Iterator[Suspects]:
    suspects = Suspects(gpucluster_session)
    yield suspects
    write = gpucluster_session.progress or print
    if not suspects.found:
        write(f"burn-in: no suspect node ({suspects.path})")
        return
    write(f"burn-in: {len(suspects.found)} suspect(s), written to {suspects.path}:")
    for suspect in suspects.found:
        write(f"  {suspect.line()}")
    commands = drain_commands(suspects.found)
    if not commands:
        return
    if request.config.getoption("gpucluster_drain"):
        write("burn-in: draining (--gpucluster-drain):")
        for outcome in run_drain(commands):
            write(f"  {outcome.line()}")
    else:
        write("burn-in: to drain them (run by --gpucluster-drain):")
        for argv in commands:
            write(f"  {shell_line(argv)}")


# ------------------------------------------------------------------------------ helpers


def _values(job) -> list[dict[str, Any]]:
    try:
        return job.values  # JobFailed (every rank's story) unless all ranks finished
    except JobSkipped as exc:
        pytest.skip(str(exc))


def _reasons(reasons: Sequence[str]) -> str:
    """Distinct reasons, the same one from many nodes said once."""
    if len(reasons) > 2:
        return f"{reasons[0]} (and {len(reasons) - 1} more like it)"
    return "; ".join(reasons)


def _nodes(session) -> int:
    return session.available_nodes


def _gate(results, readings: Sequence[Reading], suspects: Suspects, source: str, profile: str) -> None:
    """Every reading recorded; the failures reported together, each GPU or rank named."""
    __tracebackhide__ = True
    failures: list[str] = []
    for r in readings:
        # "profile NAME: burnin.min_x" lets `gpucluster profiles derive` map the value to its key.
        key = f"profile {profile}: {r.source}" if r.source and r.source.startswith("burnin.") else r.source
        try:
            results.check(
                r.metric, r.value, r.threshold, unit=r.unit, comparison=r.comparison,
                labels=r.all_labels(), source=key,
            )  # fmt: skip
        except ThresholdFailure:
            failures.append(r.sentence())
    bad = [r.suspect() for r in readings if r.failed]
    suspects.add(bad, source)
    if failures:
        raise ThresholdFailure("\n".join([f"{len(failures)} health check(s) failed:", *failures]))


def _straggler_gate(
    results,
    verdict: Verdict,
    metric: str,
    what: str,
    unit: str,
    suspects: Suspects,
    source: str,
    **labels: Any,
) -> None:
    """Record every sample, then the number of stragglers (at most 0), naming each."""
    __tracebackhide__ = True
    for s in verdict.samples:
        sample_labels = {
            "host": s.host or s.key,
            **({"rank": s.rank} if s.rank is not None else {}),
            **labels,
        }
        results.record(metric, s.value, unit=unit, labels=sample_labels)
    named = [
        st.suspect(what, unit, verdict.tolerance, higher_is_better=verdict.higher_is_better)
        for st in verdict.stragglers
    ]
    suspects.add(named, source)
    results.check(
        f"{metric}.stragglers", float(len(named)), 0.0, unit="ranks" if "rank" in metric else "nodes",
        comparison="<=", labels=labels, source="burnin.straggler_tolerance",
        context="\n".join(["Stragglers:", *(f"  {s.reason}" for s in named)]),
    )  # fmt: skip


# ------------------------------------------------------------------------------ health


@pytest.fixture(scope="module")
def health_values(cluster, nccl_env, gpucluster_session) -> list[dict[str, Any]]:
    """One health job on every node at once (the intra-node phase of the localization, too)."""
    job = cluster.run(
        HEALTH,
        nodes=_nodes(gpucluster_session),
        env=nccl_env,
        timeout=JOB_TIMEOUT_S,
        options={},
        name="burnin-health",
    )
    return _values(job)


def test_rank_health_cpu(health_values, hw, results, burnin_suspects, request) -> None:
    """Each rank's float32 matmul FLOP/s and memory copy bandwidth, against burnin.min_cpu_*."""
    readings = cpu_readings(health_values, hw.burnin)
    assert readings, "the health job returned no CPU numbers"
    _gate(results, readings, burnin_suspects, request.node.nodeid, hw.name)


def test_gpu_health(health_values, hw, results, burnin_suspects, request) -> None:
    """Each GPU's matmul, memory and host-to-device bandwidth and NVML readings."""
    readings = gpu_readings(health_values, hw.burnin)
    if not readings:
        reasons = skip_reasons(health_values, "gpu") + skip_reasons(health_values, "nvml")
        pytest.skip(_reasons(list(dict.fromkeys(reasons))) or "no GPU reading came back")
    _gate(results, readings, burnin_suspects, request.node.nodeid, hw.name)


def test_health_stragglers(health_values, hw, results, burnin_suspects, request) -> None:
    """Ranks (and nodes) whose own matmul takes longer than their peers' by more than the tolerance."""
    tolerance = hw.burnin.straggler_tolerance
    for part in ("gpu", "cpu"):  # the GPU's matmul where there is one
        samples = value_samples(health_values, part, "matmul_best_s")  # best span: load only adds
        if samples:
            break
    if len(samples) < 2:
        pytest.skip(f"straggler detection needs 2+ ranks; the health job had {len(samples)}")
    verdict = find_stragglers(samples, tolerance=tolerance)
    _straggler_gate(
        results, verdict, f"burnin.rank_{part}_matmul_time", f"{part.upper()} matmul time", "s",
        burnin_suspects, request.node.nodeid,
    )  # fmt: skip


def test_intra_node_stragglers(health_values, hw, results, burnin_suspects, request) -> None:
    """Nodes whose intra-node all_reduce (all nodes at once) is slower than the other nodes'."""
    per_node = intra_node_samples(health_values)
    if len(per_node) < 2:
        why = skip_reasons(health_values, "intra_node")
        pytest.skip(
            f"comparing nodes needs 2+ nodes with an intra-node all_reduce; got {len(per_node)}"
            + (f" ({_reasons(why)})" if why else "")
        )
    samples = [Sample(host, busbw, host) for host, busbw in per_node.items()]
    verdict = find_stragglers(samples, tolerance=hw.burnin.straggler_tolerance, higher_is_better=True)
    _straggler_gate(
        results, verdict, "burnin.node_intra_busbw", "intra-node all_reduce busbw", "B/s",
        burnin_suspects, request.node.nodeid,
    )  # fmt: skip


# ------------------------------------------------------------------------------ collectives


def _sweep(cluster, session, nccl_env, extra: dict[str, Any], name: str) -> list[dict[str, Any]]:
    job = cluster.run(
        SWEEP,
        nodes=_nodes(session),
        env=nccl_env,
        timeout=JOB_TIMEOUT_S,
        options={**STRAGGLER_SWEEP, **extra},
        name=name,
    )
    return _values(job)


def test_collective_stragglers(
    cluster, nccl_env, gpucluster_session, hw, results, burnin_suspects, request
) -> None:
    """Ranks that arrive late at an all_reduce: their time outside the calls, against the median."""
    values = _sweep(cluster, gpucluster_session, nccl_env, {}, "burnin-straggler-sweep")
    verdict = find_stragglers(
        sweep_samples(values),
        tolerance=hw.burnin.straggler_tolerance,
        min_excess=hw.burnin.straggler_min_excess,
    )
    _straggler_gate(
        results, verdict, "burnin.rank_collective_lag", "time outside the all_reduce per iteration", "s",
        burnin_suspects, request.node.nodeid,
    )  # fmt: skip
    nodes = {s.host for s in verdict.samples}
    if len(nodes) > 1:
        by_node = find_stragglers(
            worst_per_host(verdict.samples), tolerance=hw.burnin.straggler_tolerance,
            min_excess=hw.burnin.straggler_min_excess,
        )  # fmt: skip
        _straggler_gate(
            results, by_node, "burnin.node_collective_lag", "worst rank's time outside the all_reduce", "s",
            burnin_suspects, request.node.nodeid,
        )  # fmt: skip


def test_injected_straggler_is_named(cluster, nccl_env, gpucluster_session, hw, results) -> None:
    """Self-test: the last rank sleeps before every timed all_reduce; the detector must name it
    and its host, and nobody else. (Reported here, never written to the drain list.)"""
    if gpucluster_session.available_nodes * gpucluster_session.ranks_per_node < 2:
        pytest.skip("an injected straggler needs 2+ ranks to stand out from")
    world = _nodes(gpucluster_session) * gpucluster_session.ranks_per_node
    slow = world - 1
    values = _sweep(
        cluster, gpucluster_session, nccl_env,
        {"inject_delay_s": INJECTED_DELAY_S, "inject_rank": slow}, "burnin-injected-straggler",
    )  # fmt: skip
    samples = sweep_samples(values)
    verdict = find_stragglers(
        samples, tolerance=hw.burnin.straggler_tolerance, min_excess=hw.burnin.straggler_min_excess
    )
    host = next(s.host for s in samples if s.rank == slow)
    for s in samples:
        results.record(
            "burnin.injected_straggler_lag", s.value, unit="s",
            labels={"rank": s.rank, "host": s.host, "injected": s.rank == slow},
        )  # fmt: skip
    named = [(st.sample.rank, st.sample.host) for st in verdict.stragglers]
    lines = [
        st.sentence("time outside the all_reduce per iteration", "s", verdict.tolerance)
        for st in verdict.stragglers
    ]
    (gpucluster_session.progress or print)(f"burn-in self-test: suspect {'; '.join(lines) or 'none named'}")
    assert named == [(slow, host)], (
        f"rank {slow} on {host} slept {INJECTED_DELAY_S * 1e3:g} ms before every call, and the detector "
        f"named {named or 'nobody'} (tolerance {verdict.tolerance:.0%}, median {verdict.reference}); "
        f"samples: {[(s.key, s.value) for s in samples]}"
    )


# ------------------------------------------------------------------------------ ECC / XID


def _counters(cluster, session, nccl_env) -> list[dict[str, Any]]:
    job = cluster.run(
        COUNTERS, nodes=_nodes(session), env=nccl_env, timeout=JOB_TIMEOUT_S, name="burnin-counters"
    )
    values = _values(job)
    if not any(v.get("nvml") for v in values):
        reasons = skip_reasons(values, "nvml")
        pytest.skip("ECC/XID counters: " + (_reasons(reasons) or "NVML returned nothing"))
    return values


def _needs_gpus(hw) -> None:
    if hw.cluster.device != "cuda":
        pytest.skip(f"profile {hw.name} is a CPU profile: no GPUs, so no ECC or XID counters to read")


def test_counters_before(cluster, nccl_env, gpucluster_session, hw) -> None:
    """ECC, retired-page, remapped-row counters and XID events before the run (conftest runs this first)."""
    _needs_gpus(hw)
    gpucluster_session.extra["burnin_counters_before"] = _counters(cluster, gpucluster_session, nccl_env)


def test_counters_after(cluster, nccl_env, gpucluster_session, hw, results, burnin_suspects, request) -> None:
    """The same counters after the run (conftest runs this last): any increase fails, naming the GPU."""
    _needs_gpus(hw)
    before = gpucluster_session.extra.get("burnin_counters_before")
    if before is None:
        pytest.skip(
            "no before-reading of the ECC/XID counters (test_counters_before did not run in this process)"
        )
    after = _counters(cluster, gpucluster_session, nccl_env)
    grown = counter_increases(before, after)
    burnin_suspects.add(grown, request.node.nodeid)
    results.check(
        "burnin.counter_increases", float(len(grown)), 0.0, unit="GPUs", comparison="<=",
        context="\n".join(s.line() for s in grown),
    )  # fmt: skip


# ------------------------------------------------------------------------------ versions


def _read_nccl_logs(patterns: Sequence[str], root: Path) -> list[tuple[str, Any]]:
    from pytest_gpucluster.parsers.nccl_log import parse_nccl_log

    parsed = []
    for pattern in patterns:
        paths = sorted(root.glob(pattern)) if any(c in pattern for c in "*?[") else [root / pattern]
        for path in paths:
            try:
                parsed.append((str(path), parse_nccl_log(path.read_text(errors="replace"))))
            except (OSError, ParseError) as exc:
                pytest.fail(f"--nccl-log {path}: {exc}", pytrace=False)
    return parsed


def test_version_drift(health_values, hw, gpucluster_session, results, burnin_suspects, request) -> None:
    """Every node's versions against the profile's versions: pins, and every node against the others."""
    fingerprints, findings = node_fingerprints(health_values)
    logs = gpucluster_session.settings["gpucluster_nccl_log"]
    if logs:  # NCCL's own word on its version and net plugin, per host, from --nccl-log files
        from_logs, log_findings = nccl_log_fingerprints(
            _read_nccl_logs(logs, request.config.invocation_params.dir)
        )
        findings += log_findings
        for host, versions in from_logs.items():
            fingerprints.setdefault(host, {}).update(versions)
    findings += check_pins(fingerprints, hw.versions)
    findings += check_agreement(fingerprints)
    write = gpucluster_session.progress or print
    for host, versions in fingerprints.items():
        write(
            f"burn-in versions on {host}: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if v)
        )
    burnin_suspects.add([s for f in findings for s in f.suspects()], request.node.nodeid)
    pins = ", ".join(f"{k} {v}" for k, v in hw.versions.items()) or "none"
    results.check(
        "burnin.version_drift", float(len(findings)), 0.0, unit="findings", comparison="<=",
        source=f"profile {hw.name} versions: {pins}",
        context="\n".join(f.message for f in findings),
    )  # fmt: skip


# ------------------------------------------------------------------------------ pairwise


@pytest.mark.burnin(slow=True)
@pytest.mark.gpucluster(needs=["multi-node"])
def test_pairwise_localization(
    cluster, nccl_env, gpucluster_session, hw, health_values, results, burnin_suspects, request
) -> None:
    """Disjoint node pairs, then each node of a failing pair against a known-good node: the slow
    node or link is named in two rounds (about n/2 + 2 pair jobs, not n^2)."""
    b = hw.burnin
    write = gpucluster_session.progress or print
    nodes = list(cluster.spec.host_names[: gpucluster_session.available_nodes])
    # Phase 0 happened in the health job: every node's intra-node all_reduce, all at once. A node
    # slow on its own is named there (test_intra_node_stragglers) and kept out of the pairs, where
    # it would only make its partner look bad.
    per_node = intra_node_samples(health_values)
    slow_alone: set[str] = set()
    if len(per_node) >= 2:
        verdict = find_stragglers(
            [Sample(h, v, h) for h, v in per_node.items()],
            tolerance=b.straggler_tolerance,
            higher_is_better=True,
        )
        slow_alone = {st.sample.key for st in verdict.stragglers}
    paired = [n for n in nodes if n not in slow_alone]
    runner = ClusterPairRunner(
        cluster, size_bytes=int(b.pair_size), iters=b.pair_iters, env=nccl_env, timeout_s=JOB_TIMEOUT_S,
        on_result=lambda rnd, r: write(
            f"burn-in pair round {rnd}: {r.pair[0]}<->{r.pair[1]} "
            + (f"{r.busbw / 1e9:.3g} GB/s" if r.busbw is not None else f"failed: {r.error}")
        ),
    )  # fmt: skip
    found = localize(paired, runner, tolerance=b.straggler_tolerance, floor=b.pair_min_busbw)
    for index, judged in enumerate(found.rounds, start=1):
        for j in judged:
            if j.result.busbw is not None:
                results.record(
                    "burnin.pair_busbw", j.result.busbw, unit="B/s", scope="inter-node",
                    labels={"pair": f"{j.pair[0]}<->{j.pair[1]}", "round": index},
                )  # fmt: skip
    results.record("burnin.pair_jobs", float(runner.jobs), unit="jobs", labels={"nodes": len(paired)})
    for line in found.lines():
        write(line)
    burnin_suspects.add(found.suspects, request.node.nodeid)
    excluded = f" ({', '.join(sorted(slow_alone))} left out: slow on their own)" if slow_alone else ""
    results.check(
        "burnin.pairwise_suspects", float(len(found.suspects)), 0.0, unit="suspects", comparison="<=",
        labels={"nodes": len(paired)}, source="burnin.straggler_tolerance",
        context="\n".join(found.lines()) + excluded,
    )  # fmt: skip
