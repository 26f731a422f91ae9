"""checks/collectives and plans/collectives (judging and planning the collective tests) and
launch/nccl_tests, without launching anything: synthetic rank values, a recorded nccl-tests output,
a stand-in binary."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from pytest_gpucluster.checks.collectives import (
    Case,
    CollectiveData,
    cases,
    collect,
    collective_checks,
    human_size,
    points_from_runs,
    scope_nodes,
)
from pytest_gpucluster.errors import JobFailed, LaunchError, ProfileError, SettingsError
from pytest_gpucluster.launch.nccl_tests import binary_path, build_command, run_command
from pytest_gpucluster.maths.metrics import COLLECTIVES
from pytest_gpucluster.parsers.nccl_tests import parse
from pytest_gpucluster.plans.collectives import (
    WORKLOAD,
    SweepRequest,
    confirmation_part,
    job_options,
    job_timeout,
    sweep_part,
    sweep_requests,
)
from pytest_gpucluster.profiles.schema import CollectivesSection
from pytest_gpucluster.results.model import Check, ThresholdRef
from pytest_gpucluster.results.recorder import Recorder, ThresholdFailure

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl_tests"
KiB, MiB = 1 << 10, 1 << 20


def section(*checks: dict, **sweep) -> CollectivesSection:
    grid = {"min_bytes": "1KiB", "max_bytes": "16MiB", "factor": 4, "iters": 10, "warmup": 3} | sweep
    return CollectivesSection.model_validate({"repeat": 3, "sweep": grid, "checks": list(checks)})


AR_CHECKS = (
    {"collective": "all_reduce", "scope": "intra-node", "size": "16MiB", "min_busbw": "0.3GB/s"},
    {"collective": "all_reduce", "scope": "intra-node", "size": "1KiB", "max_latency": "1.5ms"},
)


# ------------------------------------------------------------------------------- planning


def test_cases_cover_every_collective_intra_node_and_each_checked_pair():
    sec = section(
        *AR_CHECKS,
        {"collective": "all_reduce", "scope": "inter-node", "size": "1GiB", "min_busbw": "40GB/s"},
        {"collective": "broadcast", "scope": "full", "size": "3MiB", "min_busbw": "10GB/s", "source": "x"},
    )
    got = cases(sec)
    assert [c.id for c in got] == [f"{c}-intra-node" for c in COLLECTIVES] + [
        "all_reduce-inter-node",
        "broadcast-full",
    ]
    by_id = {c.id: c for c in got}
    assert [i for i, _ in by_id["all_reduce-intra-node"].checks] == [0, 1]
    assert by_id["all_gather-intra-node"].checks == ()
    assert [i for i, _ in by_id["broadcast-full"].checks] == [3]


def test_scope_nodes():
    assert scope_nodes("intra-node", 4) == (1, None)
    assert scope_nodes("inter-node", 4) == (2, None)
    assert scope_nodes("full", 4) == (4, None)
    assert scope_nodes("full", 1) == (1, None)
    nodes, reason = scope_nodes("inter-node", 1)
    assert nodes == 0 and "2 nodes" in reason and "this session has 1" in reason and "--hostfile" in reason
    with pytest.raises(ValueError, match="unknown scope"):
        scope_nodes("rack", 2)


def test_sweep_requests_add_a_one_size_sweep_per_checked_size_off_the_grid():
    sec = section(
        {"collective": "all_reduce", "size": "16MiB", "min_busbw": "1GB/s"},  # on the grid
        {"collective": "all_reduce", "size": "3MiB", "min_busbw": "1GB/s"},  # between points
        {"collective": "all_reduce", "size": "32GB", "min_busbw": "1GB/s"},  # beyond max_bytes
    )
    case = cases(sec)[0]
    assert sweep_requests(case, sec.sweep) == [
        SweepRequest("all_reduce", KiB, 16 * MiB, 4),
        SweepRequest("all_reduce", 3 * MiB, 3 * MiB, 4),
        SweepRequest("all_reduce", 32 * 10**9, 32 * 10**9, 4),
    ]


def test_non_integer_factor_is_a_profile_error():
    sec = section(factor=1.5)
    with pytest.raises(ProfileError, match=r"factor is 1\.5.*integer"):
        sweep_requests(cases(sec)[0], sec.sweep)


def test_each_case_is_a_part_on_the_nodes_its_scope_means():
    sec = section(
        *AR_CHECKS,
        {"collective": "all_reduce", "scope": "full", "size": "3MiB", "min_busbw": "1GB/s"},
        {"collective": "broadcast", "scope": "inter-node", "size": "1MiB", "min_busbw": "1GB/s"},
    )
    by_id = {c.id: c for c in cases(sec)}
    full = sweep_part(by_id["all_reduce-full"], sec, available_nodes=1, backend="gloo")
    assert (full.workload, full.nodes, full.name) == (WORKLOAD, 1, "collectives-all_reduce-full")
    sizes = [(s["collective"], s["min_bytes"], s["max_bytes"]) for s in full.options["sweeps"]]
    assert sizes == [("all_reduce", KiB, 16 * MiB), ("all_reduce", 3 * MiB, 3 * MiB)]
    # inter-node cannot run on 1 node: no part (the test skips with scope_nodes' reason)
    assert sweep_part(by_id["broadcast-inter-node"], sec, available_nodes=1, backend="gloo") is None
    assert sweep_part(by_id["broadcast-inter-node"], sec, available_nodes=4, backend="gloo").nodes == 2
    assert sweep_part(by_id["all_reduce-full"], sec, available_nodes=4, backend="gloo").nodes == 4
    # two cases on the same nodes are two parts the harness bundles into one job (same shape)
    intra = sweep_part(by_id["all_gather-intra-node"], sec, available_nodes=4, backend="gloo")
    assert intra.key != full.key and (intra.nodes, intra.nproc_per_node, intra.env) == (1, None, {})


def test_job_options_and_timeout():
    sec = section(dtype="bfloat16", check=False)
    requests = [SweepRequest("all_reduce", KiB, 16 * MiB, 4)]
    opts = job_options(requests, sec.sweep, 3)
    assert opts == {
        "sweeps": [
            {
                "warmup": 3,
                "iters": 10,
                "dtype": "bfloat16",
                "op": "sum",
                "check": False,
                "repeat": 3,
                "collective": "all_reduce",
                "min_bytes": KiB,
                "max_bytes": 16 * MiB,
                "factor": 4,
            }
        ]
    }
    # ~22 MB per pass x 70 calls at the 0.05 GB/s floor: ~31 s, plus start-up; a healthy gloo
    # run (1.2 GB/s) needs ~1.3 s of that.
    timeout = job_timeout(requests, sec.sweep, 3, "gloo")
    assert 150 < timeout < 160
    assert job_timeout(requests, sec.sweep, 3, "nccl") < 126


def test_human_size():
    assert [human_size(s) for s in (1000, KiB, 16 * MiB, 32 * 10**9)] == [
        "1000 B",
        "1 KiB",
        "16 MiB",
        "29.8 GiB",
    ]


# ------------------------------------------------------------------------------- judging


def rank_value(rank: int, collective: str, sizes: list[int], times: dict, lag: float = 0.0, wrong: int = 0):
    """What collectives.sweep returns on one rank, with chosen times (us) per size."""
    points = []
    for size in sizes:
        cell = {"times_us": list(times[size]), "lag_us": [lag] * len(times[size]), "wrong": wrong}
        points.append({"size_bytes": size, "count": size // 4, "out_of_place": cell, "in_place": dict(cell)})
    return {"collective": collective, "nranks": 2, "rank": rank, "points": points}


def job_values(sweeps_per_rank: list[list[dict]]) -> list[dict]:
    return [
        {"sweeps": sweeps, "rank": r, "host": f"node{r}", "nranks": 2}
        for r, sweeps in enumerate(sweeps_per_rank)
    ]


# 16 MiB in 13981 us is 1.2 GB/s (all_reduce on 2 ranks: busbw = algbw).
GRID = {KiB: [400.0, 420.0, 5000.0], 16 * MiB: [13981.0, 13981.0, 60000.0]}
EXTRA = {3 * MiB: [3000.0, 3100.0, 2900.0]}


def measured(**overrides):
    r0 = rank_value(0, "all_reduce", [KiB, 16 * MiB], GRID)
    r1 = rank_value(
        1, "all_reduce", [KiB, 16 * MiB], GRID, lag=overrides.get("lag", 0.0), wrong=overrides.get("wrong", 0)
    )
    x0 = rank_value(0, "all_reduce", [3 * MiB], EXTRA)
    x1 = rank_value(1, "all_reduce", [3 * MiB], EXTRA)
    skip = {"collective": "alltoall", "skipped": "the gloo backend cannot run alltoall", "rank": 0}
    return collect(job_values([[r0, x0, skip], [r1, x1, {**skip, "rank": 1}]]))


def test_collect_merges_sweeps_of_a_collective_and_reports_skips():
    data = measured()
    assert data["alltoall"].skipped == "the gloo backend cannot run alltoall"
    ar = data["all_reduce"]
    assert ar.hosts == ("node0", "node1")
    assert [(p.size_bytes, p.in_place) for p in ar.points] == [
        (KiB, False),
        (KiB, True),
        (3 * MiB, False),
        (3 * MiB, True),
        (16 * MiB, False),
        (16 * MiB, True),
    ]
    assert ar.wrong_by_rank[(KiB, False)] == (0, 0)


def test_collect_refuses_a_job_without_values():
    with pytest.raises(JobFailed, match="returned no rank values"):
        collect([])


def ar_case(*checks: dict) -> Case:
    return cases(section(*checks))[0]


def by_metric(gs):
    out: dict = {}
    for g in gs:
        out.setdefault(g.metric, []).append(g)
    return out


def test_checks_threshold_the_checked_points_and_record_the_rest():
    case = ar_case(*AR_CHECKS, {"collective": "all_reduce", "size": "3MiB", "min_busbw": "0.5GB/s"})
    gs = collective_checks(
        case, measured()["all_reduce"], profile="cpu-local", nodes=1, dtype="float32", origin="job J"
    )
    got = by_metric(gs)
    busbw = {(g.labels["size_bytes"], g.labels["placement"]): g for g in got["collectives.all_reduce.busbw"]}
    assert len(busbw) == 6
    gated = busbw[(16 * MiB, "out_of_place")]
    assert (
        gated.threshold == pytest.approx(0.3e9) and gated.comparison == ">=" and gated.scope == "intra-node"
    )
    assert gated.value == pytest.approx(1.2e9, rel=1e-4)  # the median repeat, not the 60 ms outlier
    assert gated.spread.n == 3 and gated.spread.min == pytest.approx(16 * MiB / 0.06)
    assert gated.ref == ThresholdRef("cpu-local", ("collectives", "checks", 0, "min_busbw"))
    assert gated.labels == {
        "size_bytes": 16 * MiB,
        "collective": "all_reduce",
        "placement": "out_of_place",
        "dtype": "float32",
        "nodes": 1,
    }
    assert busbw[(16 * MiB, "in_place")].threshold is None  # in-place is recorded, not gated
    assert busbw[(3 * MiB, "out_of_place")].threshold == pytest.approx(0.5e9)
    latency = {g.labels["size_bytes"]: g for g in got["collectives.all_reduce.latency"]}
    assert sorted(latency) == [KiB, 3 * MiB, 16 * MiB]  # out-of-place only
    assert latency[KiB].value == pytest.approx(420e-6) and latency[KiB].threshold == pytest.approx(1.5e-3)
    assert latency[KiB].comparison == "<=" and latency[KiB].unit == "s"
    assert latency[16 * MiB].threshold is None
    [wrong] = got["collectives.all_reduce.wrong"]
    assert (wrong.value, wrong.threshold, wrong.comparison) == (0.0, 0.0, "==")


def test_failure_message_states_value_threshold_size_scope_and_the_slowest_rank(tmp_path):
    case = ar_case({"collective": "all_reduce", "size": "16MiB", "min_busbw": "12GB/s"})
    data = measured(lag=900.0)  # rank 1 spends 0.9 ms per op outside the calls: a straggler
    gs = collective_checks(
        case, data["all_reduce"], profile="copy", nodes=1, dtype="float32", origin="sweep job J1"
    )
    assert [g.metric for g in gs if g.failed] == ["collectives.all_reduce.busbw"]
    recorder = Recorder(path=tmp_path / "results.json")
    with pytest.raises(ThresholdFailure) as info:
        recorder.check_all(gs)
    assert len(recorder.measurements) == len(gs)  # every value recorded, the miss included
    message = str(info.value)
    assert len(message.splitlines()) == 1  # the one failing check
    assert "collectives.all_reduce.busbw [intra-node]" in message
    assert "measured 1.2 GB/s, expected at least 12 GB/s" in message
    assert "size_bytes=16777216" in message and "all_reduce of 16 MiB (out-of-place, float32)" in message
    assert "on 1 node(s) x 2 ranks, scope intra-node" in message
    assert "slowest rank 1 on node1" in message and "0.9 ms outside the calls" in message
    assert "threshold from profile copy: collectives.checks[0].min_busbw" in message
    assert "median of 3" in message and "sweep job J1" in message


def test_wrong_elements_name_the_rank_and_host():
    gs = collective_checks(
        ar_case(), measured(wrong=3)["all_reduce"], profile="p", nodes=1, dtype="float32", origin="J"
    )
    [wrong] = [g for g in gs if g.metric.endswith(".wrong")]
    assert wrong.value == 12.0  # 3 on rank 1, both sizes, both placements
    assert "1 KiB out-of-place: 3 (rank 1 on node1: 3)" in wrong.hint


def test_no_wrong_elements_check_when_the_check_is_off():
    data = measured()["all_reduce"]
    points = tuple(
        p.__class__(**{**{f: getattr(p, f) for f in p.__slots__}, "wrong": None}) for p in data.points
    )
    gs = collective_checks(
        ar_case(),
        CollectiveData("all_reduce", points, hosts=data.hosts),
        profile="p",
        nodes=1,
        dtype="float32",
        origin="J",
    )
    assert not [g for g in gs if g.metric.endswith(".wrong")]


def test_a_checked_size_that_was_not_measured_is_an_error_not_a_pass():
    case = ar_case({"collective": "all_reduce", "size": "64MiB", "min_busbw": "1GB/s"})
    with pytest.raises(JobFailed, match="no measurement at the checked size"):
        collective_checks(case, measured()["all_reduce"], profile="p", nodes=1, dtype="float32", origin="J")


def test_nccl_tests_output_is_judged_by_the_same_collective_checks():
    """Two 'repeats' of a real 2-node x 8 H100 all_reduce run: the gate reads nccl-tests' own busbw."""
    text = (DATA / "gcp_a3mega_h100x16_all_reduce_2node.md").read_text()
    points = points_from_runs([parse(text), parse(text)])
    one_mib = next(p for p in points if p.size_bytes == MiB and not p.in_place)
    assert (one_mib.busbw_gbs, one_mib.time_us, one_mib.nranks, one_mib.wrong) == (9.68, 203.2, 16, 0)
    case = cases(
        section({"collective": "all_reduce", "scope": "inter-node", "size": "1MiB", "min_busbw": "20GB/s"})
    )[-1]
    data = CollectiveData("all_reduce", tuple(points), hosts=("a", "b"))
    gs = collective_checks(
        case, data, profile="p", nodes=2, dtype="float32", origin="all_reduce_perf", tool="nccl-tests"
    )
    [gate] = [g for g in gs if g.threshold is not None and g.metric.endswith(".busbw")]
    assert (gate.value, gate.threshold, gate.scope) == (9.68e9, 20e9, "inter-node")
    assert gate.labels["tool"] == "nccl-tests"
    assert "nccl-tests prints no per-rank times" in gate.hint and "on 2 node(s) x 8 ranks" in gate.hint


# ------------------------------------------------------------------------------- the nccl-tests runner

FAKE_BINARY = """#!{python}
import sys
from pathlib import Path
from pytest_gpucluster.parsers.nccl_tests import Measurement, Row, format_table

args = sys.argv[1:]
Path(__file__).with_suffix(".argv").write_text(" ".join(args))
size = int(args[args.index("-b") + 1])
cell = Measurement(time_us=100.0, algbw_gbs=size / 100e3, busbw_gbs=size / 100e3, wrong=0)
gpus = int(args[args.index("-g") + 1])
print("# nThread 1 nGpus", gpus, "minBytes", size)
for gpu in range(gpus):
    print(f"#  Rank {{gpu:2d}} Group  0 Pid   1 on   node0 device {{gpu:2d}} [0x1a] NVIDIA H100")
print(format_table([Row(size, size // 2, "bfloat16", "sum", -1, cell, cell)], collective="all_reduce"))
sys.exit({code})
"""


def fake_binary(directory: Path, code: int = 0, name: str = "all_reduce_perf") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(FAKE_BINARY.format(python=sys.executable, code=code))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_binary_path_says_what_the_directory_holds(tmp_path):
    binary = fake_binary(tmp_path / "nccl-tests" / "build")
    assert binary_path(tmp_path / "nccl-tests", "all_reduce") == binary
    with pytest.raises(SettingsError, match=r"no alltoall_perf in nccl-tests directory .* holds: no \*_perf"):
        binary_path(tmp_path / "nccl-tests", "alltoall")
    with pytest.raises(SettingsError, match="does not exist"):
        binary_path(tmp_path / "nowhere", "all_reduce")


def test_build_command_runs_one_local_node_directly_and_several_through_mpirun():
    common = dict(
        min_bytes=MiB, max_bytes=MiB, factor=2, warmup=5, iters=20, dtype="bfloat16", op="sum", check=True
    )
    direct = build_command("/nt/all_reduce_perf", ["localhost"], 8, env={"NCCL_DEBUG": "WARN"}, **common)
    assert direct.argv == (
        "/nt/all_reduce_perf", "-b", str(MiB), "-e", str(MiB), "-f", "2", "-g", "8",
        "-w", "5", "-n", "20", "-c", "1", "-d", "bfloat16", "-o", "sum",
    )  # fmt: skip
    assert direct.env == {"NCCL_DEBUG": "WARN"}
    mpi = build_command(
        "/nt/all_reduce_perf", ["n1", "n2"], 8, env={"NCCL_DEBUG": "WARN"}, allow_run_as_root=False, **common
    )
    argv = list(mpi.argv)
    assert argv[:5] == ["mpirun", "-np", "16", "-H", "n1:8,n2:8"]
    assert argv[argv.index("-x") : argv.index("-x") + 2] == ["-x", "NCCL_DEBUG=WARN"]
    assert argv[argv.index("/nt/all_reduce_perf") + 1 :] == [
        "-b", str(MiB), "-e", str(MiB), "-f", "2", "-g", "1", "-n", "20", "-w", "5", "-c", "1", "-d", "bfloat16", "-o", "sum",
    ]  # fmt: skip
    with pytest.raises(SettingsError, match="at least one GPU per node"):
        build_command("/nt/all_reduce_perf", ["localhost"], 0, env={}, **common)


def test_run_command_parses_the_binarys_table(tmp_path):
    binary = fake_binary(tmp_path / "nt")
    common = dict(
        min_bytes=4 * MiB,
        max_bytes=4 * MiB,
        factor=2,
        warmup=1,
        iters=2,
        dtype="bfloat16",
        op="sum",
        check=True,
    )
    command = build_command(binary, ["localhost"], 2, env={}, **common)
    [run] = run_command(command, tmp_path / "logs" / "ar.log", timeout_s=60)
    assert run.collective == "all_reduce" and [r.size_bytes for r in run.rows] == [4 * MiB]
    assert run.rows[0].out_of_place.busbw_gbs == pytest.approx(41.94, abs=0.01)
    assert "-g 2" in binary.with_suffix(".argv").read_text()
    assert (tmp_path / "logs" / "ar.log").read_text().startswith(f"$ {binary}")


def test_run_command_reports_a_failed_binary_with_its_log(tmp_path):
    binary = fake_binary(tmp_path / "nt", code=3)
    common = dict(
        min_bytes=MiB, max_bytes=MiB, factor=2, warmup=1, iters=2, dtype="float32", op="sum", check=True
    )
    with pytest.raises(LaunchError, match=r"exited with code 3(.|\n)*log: .*ar\.log"):
        run_command(
            build_command(binary, ["localhost"], 2, env={}, **common), tmp_path / "ar.log", timeout_s=60
        )


# ------------------------------------------------------------------------------- the regression gate


def test_each_curve_gets_a_peak_and_a_largest_size_summary_the_gate_judges():
    case = ar_case(*AR_CHECKS)
    gs = by_metric(
        collective_checks(
            case, measured()["all_reduce"], profile="cpu-local", nodes=1, dtype="float32", origin="J"
        )
    )
    (peak,) = gs["collectives.all_reduce.busbw_peak"]
    (last,) = gs["collectives.all_reduce.busbw_at_max_size"]
    points = {
        g.labels["size_bytes"]: g
        for g in gs["collectives.all_reduce.busbw"]
        if g.labels["placement"] == "out_of_place"
    }
    best = max(points.values(), key=lambda g: g.value)
    assert peak.value == best.value and peak.spread == best.spread and "at 16 MiB" in peak.hint
    assert last.value == points[16 * MiB].value and last.labels["size_bytes"] == 16 * MiB
    assert peak.labels == {"collective": "all_reduce", "dtype": "float32", "nodes": 1}
    assert (peak.threshold, peak.baseline_gate, last.baseline_gate) == (None, True, True)
    assert all(g.baseline_gate is None for g in gs["collectives.all_reduce.busbw"])  # points: shown only


def test_a_partial_remeasurement_keeps_the_checks_of_its_sizes_and_no_summaries():
    case = ar_case(*AR_CHECKS)  # checks at 16 MiB and 1 KiB
    only_big = collect(job_values([[rank_value(r, "all_reduce", [16 * MiB], GRID)] for r in (0, 1)]))
    with pytest.raises(JobFailed, match="no measurement at the checked size"):
        collective_checks(case, only_big["all_reduce"], profile="p", nodes=1, dtype="float32", origin="J")
    gs = by_metric(
        collective_checks(
            case, only_big["all_reduce"], profile="p", nodes=1, dtype="float32", origin="J", partial=True
        )
    )
    (busbw,) = [g for g in gs["collectives.all_reduce.busbw"] if g.labels["placement"] == "out_of_place"]
    assert busbw.threshold == pytest.approx(0.3e9) and busbw.labels["size_bytes"] == 16 * MiB
    assert (
        "collectives.all_reduce.busbw_peak" not in gs and "collectives.all_reduce.busbw_at_max_size" not in gs
    )


def test_confirmation_part_sweeps_only_the_suspect_sizes_unless_a_summary_is_suspect():
    sec = section(*AR_CHECKS)
    case = cases(sec)[0]
    first = sweep_part(case, sec, 1, "gloo")
    point = Check("collectives.all_reduce.busbw", 1.0, "B/s", 1.0, labels={"size_bytes": 16 * MiB})
    part, whole = confirmation_part(first, case, sec, [point])
    assert not whole and part.name == "collectives-all_reduce-intra-node-confirm"
    assert [(s["min_bytes"], s["max_bytes"]) for s in part.options["sweeps"]] == [(16 * MiB, 16 * MiB)]
    assert (part.workload, part.nodes, part.env, part.timeout_s) == (
        first.workload,
        first.nodes,
        first.env,
        first.timeout_s,
    )
    assert part.key != first.key
    peak = Check("collectives.all_reduce.busbw_peak", 1.0, "B/s", baseline_gate=True)
    part, whole = confirmation_part(first, case, sec, [point, peak])
    assert whole and part.options["sweeps"] == first.options["sweeps"]
