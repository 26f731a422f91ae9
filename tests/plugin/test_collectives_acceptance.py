"""acceptance/test_collectives.py run whole (pytester).

- A copy of cpu-local with its busbw threshold 10x higher (and an impossible latency) fails,
  with a message stating the measured value, the threshold, the size and the scope, naming the
  slowest rank's host; one real 2-rank gloo job (small sweep, -k all_reduce), shared by the
  intra-node and full tests.
- The nccl-tests path on a GPU-shaped copy, with stand-in binaries that print nccl-tests tables.
"""

from __future__ import annotations

import socket
import stat
import sys
from pathlib import Path

import pytest
import yaml
from acceptance_runs import acceptance_run, measurements, results_dir
from node_fakes import use_machine

from pytest_gpucluster.profiles.detect import MachineInfo

REPO = Path(__file__).resolve().parents[2]
ACCEPTANCE = REPO / "acceptance" / "test_collectives.py"
CPU_LOCAL = REPO / "thresholds" / "cpu-local.yaml"


@pytest.fixture
def run(pytester, tmp_path, monkeypatch):
    return acceptance_run(pytester, monkeypatch, tmp_path, {"test_collectives": ACCEPTANCE})


def write_profile(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_thresholds_10x_stricter_fail_with_value_threshold_size_scope_and_host(run, tmp_path):
    profile = yaml.safe_load(CPU_LOCAL.read_text(encoding="utf-8"))
    profile["name"] = "cpu-local-10x"
    checks = profile["collectives"]["checks"]
    busbw = next(c for c in checks if "min_busbw" in c)
    latency = next(c for c in checks if "max_latency" in c)
    assert (busbw["size"], latency["size"]) == ("16MiB", "1KiB")
    busbw["min_busbw"] = "3GB/s"  # cpu-local's 0.3 GB/s x 10
    # 1 KiB over gloo cannot take 50 us (a loopback TCP round trip alone is ~80 us), loaded or not.
    latency["max_latency"] = "50us"
    assert busbw["min_busbw"] == "3GB/s" and checks[0]["min_busbw"] == "3GB/s"
    checks += [
        {"collective": "all_reduce", "scope": "full", "size": "64KiB", "min_busbw": "1MB/s"},
        {"collective": "all_reduce", "scope": "inter-node", "size": "1MiB", "min_busbw": "1MB/s"},
    ]
    # A small grid (1, 8, 64 KiB) keeps the run short; 16 MiB, off the grid, gets its own sweep.
    profile["collectives"]["sweep"] |= {"max_bytes": "64KiB", "factor": 8, "iters": 5, "warmup": 1}
    path = write_profile(tmp_path / "cpu-local-10x.yaml", profile)

    result = run(f"--hw={path}", "-k", "all_reduce")

    result.assert_outcomes(passed=1, failed=1, skipped=4)  # full passes; inter-node, nccl-tests x3 skip
    lines = result.stdout.lines
    host = socket.gethostname()
    # The failure: every missed threshold, one line each, then where to look.
    [busbw_line] = [ln for ln in lines if ln.startswith("E") and "all_reduce.busbw [intra-node]" in ln]
    assert "(size_bytes=16777216, collective=all_reduce, placement=out_of_place" in busbw_line
    assert (
        "expected at least 3 GB/s (threshold from profile cpu-local-10x: collectives.checks[0].min_busbw"
        in (busbw_line)
    )
    assert "median of 3, range" in busbw_line
    measured = busbw_line.split(": measured ", 1)[1].split(",", 1)[0]
    assert measured.endswith(" GB/s") and float(measured.split()[0]) < 3
    assert (
        "all_reduce of 16 MiB (out-of-place, float32) on 1 node(s) x 2 ranks, scope intra-node" in busbw_line
    )
    assert f"slowest rank 0 on {host}" in busbw_line or f"slowest rank 1 on {host}" in busbw_line
    assert "progress.log" in busbw_line
    [latency_line] = [ln for ln in lines if ln.startswith("E") and "all_reduce.latency [intra-node]" in ln]
    assert "(size_bytes=1024," in latency_line and "expected at most 50 us" in latency_line
    assert "all_reduce of 1 KiB" in latency_line
    assert any("needs 2 nodes" in ln for ln in lines)  # the inter-node check, on 1 node

    got = measurements(tmp_path)
    gated = {
        (m["metric"], m["scope"], m["labels"]["size_bytes"]): m
        for m in got
        if m["threshold"] is not None and "size_bytes" in m["labels"]
    }
    assert gated[("collectives.all_reduce.busbw", "intra-node", 16 << 20)]["verdict"] == "fail"
    assert gated[("collectives.all_reduce.latency", "intra-node", 1024)]["verdict"] == "fail"
    assert gated[("collectives.all_reduce.busbw", "full", 64 << 10)]["verdict"] == "pass"
    busbw_16m = gated[("collectives.all_reduce.busbw", "intra-node", 16 << 20)]
    assert busbw_16m["spread"]["n"] == 3 and busbw_16m["value"] < 3e9
    wrong = [m for m in got if m["metric"] == "collectives.all_reduce.wrong"]
    assert [(m["scope"], m["value"], m["verdict"]) for m in wrong] == [
        ("intra-node", 0, "pass"),
        ("full", 0, "pass"),
    ]
    # The busbw curve: both placements at 1, 8, 64 KiB and 16 MiB, from one job for both scopes.
    curve = [m for m in got if m["metric"] == "collectives.all_reduce.busbw" and m["scope"] == "intra-node"]
    assert sorted((m["labels"]["size_bytes"], m["labels"]["placement"]) for m in curve) == sorted(
        (s, p) for s in (1024, 8192, 65536, 16 << 20) for p in ("in_place", "out_of_place")
    )
    # one job swept both scopes (the harness ran their parts together)
    [job] = (results_dir(tmp_path) / "jobs").iterdir()
    assert job.name.startswith("shared-2-parts-")


FAKE_BINARY = """#!{python}
import sys
from pathlib import Path
from pytest_gpucluster.parsers.nccl_tests import Measurement, Row, format_table

args = sys.argv[1:]
with open(Path(__file__).parent / "calls.txt", "a") as calls:
    calls.write(" ".join([Path(__file__).name, *args]) + "\\n")
size = int(args[args.index("-b") + 1])
busbw = {busbw_gbs}
cell = Measurement(time_us=size / (busbw * 1e3), algbw_gbs=busbw, busbw_gbs=busbw, wrong=0)
print("#  Rank  0 Group  0 Pid   1 on   node0 device  0 [0x1a] NVIDIA H100")
print("#  Rank  1 Group  0 Pid   2 on   node0 device  1 [0x1b] NVIDIA H100")
print(format_table([Row(size, size // 4, "bfloat16", "sum", -1, cell, cell)], collective="{collective}"))
"""


def test_nccl_tests_binaries_are_gated_by_the_profile(run, tmp_path, monkeypatch):
    """A GPU-shaped profile, stand-in all_reduce_perf (100 GB/s) and broadcast_perf binaries: the
    all_reduce check passes, the broadcast one (200 GB/s wanted) fails naming nccl-tests."""
    use_machine(
        monkeypatch,
        MachineInfo(
            hostname="testhost",
            cuda_available=False,  # keeps the fingerprint from importing torch to read CUDA versions
            gpu_names=("NVIDIA H100",) * 2,
            capabilities=frozenset({"cuda", "nccl"}),
        ),
    )
    binaries = tmp_path / "nccl-tests"
    binaries.mkdir()
    for name in ("all_reduce", "broadcast"):
        path = binaries / f"{name}_perf"
        path.write_text(FAKE_BINARY.format(python=sys.executable, busbw_gbs=100.0, collective=name))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    profile = {
        "name": "gpu-pair",
        "description": "two GPUs on one node, for the nccl-tests path",
        "cluster": {"nodes": 1, "gpus_per_node": 2, "device": "cuda", "backend": "nccl"},
        "collectives": {
            "repeat": 2,
            "sweep": {"dtype": "bfloat16", "iters": 7, "warmup": 1},
            "checks": [
                {"collective": "all_reduce", "scope": "intra-node", "size": "1GiB", "min_busbw": "90GB/s"},
                {"collective": "broadcast", "scope": "intra-node", "size": "256MiB", "min_busbw": "200GB/s"},
            ],
        },
    }
    path = write_profile(tmp_path / "gpu-pair.yaml", profile)

    result = run(f"--hw={path}", f"--nccl-tests-dir={binaries}", "-k", "test_nccl_tests")

    result.assert_outcomes(passed=1, failed=1)
    [line] = [ln for ln in result.stdout.lines if ln.startswith("E") and "broadcast.busbw [intra-node]" in ln]
    assert "(size_bytes=268435456, collective=broadcast, placement=out_of_place, dtype=bfloat16" in line
    assert "tool=nccl-tests): measured 100 GB/s, expected at least 200 GB/s" in line
    assert "broadcast of 256 MiB (out-of-place, bfloat16) on 1 node(s) x 2 ranks, scope intra-node" in line
    assert "nccl-tests prints no per-rank times" in line and "broadcast_perf on" in line
    calls = (binaries / "calls.txt").read_text().splitlines()
    assert (
        calls.count(f"all_reduce_perf -b {1 << 30} -e {1 << 30} -f 2 -g 2 -w 1 -n 7 -c 1 -d bfloat16 -o sum")
        == 2
    )
    assert len(calls) == 4  # repeat 2 x 2 checks, run directly with -g 2 (one local node)


FAILING_CLUSTER = """
import pytest
from pytest_gpucluster.errors import JobFailed
from pytest_gpucluster.launch.result import JobSkipped

CALLS = []


class FakeJob:
    job_id, job_dir = "collectives-1node-x", "jobs/collectives-1node-x"

    @property
    def values(self):
        raise {error}


class FakeCluster:
    def run(self, workload, **kwargs):
        CALLS.append(workload)
        with open("calls.txt", "a") as out:
            out.write(workload + "\\n")
        return FakeJob()


@pytest.fixture(scope="session")
def cluster():
    return FakeCluster()
"""


@pytest.mark.parametrize(
    ("error", "outcomes", "shown"),
    [
        (
            'JobFailed("job collectives-1node-x failed (1 of 2 ranks failed)\\nrank 1 on node7 raised OSError")',
            # the job is the test's fixture, but a crashed workload fails the test (not an error at
            # set-up); the skips are the inter-node test (one node) and the nccl-tests test of both
            # scopes (no binaries)
            {"failed": 7, "skipped": 3},
            "rank 1 on node7 raised OSError",
        ),
        (
            'JobSkipped("job collectives-1node-x skipped on ranks 0, 1: no CUDA device")',
            {"skipped": 10},
            "no CUDA device",
        ),
    ],
    ids=["failed", "skipped"],
)
def test_a_failed_or_skipped_sweep_job_is_launched_once_and_reported_by_every_test(
    run, pytester, error, outcomes, shown
):
    pytester.makeconftest(FAILING_CLUSTER.format(error=error))
    result = run("--hw=cpu-local")
    result.assert_outcomes(**outcomes)
    # one launch for the 7 collectives, whose parts the harness bundled
    assert (pytester.path / "calls.txt").read_text().splitlines() == [
        "pytest_gpucluster.workloads.bundle:run_parts"
    ]
    text = result.stdout.str()
    if "failed" in outcomes:  # each test shows the job's report, counted as infrastructure
        assert text.count(shown) >= 7
        assert "INFRASTRUCTURE ERRORS (the job could not run, a rank crashed or hung): 7" in text
        assert "_skip_on_job_skipped" not in text  # the report, not a traceback through the hooks
    else:  # -rs groups the 7 identical reasons
        assert any(line.startswith("SKIPPED [7]") and shown in line for line in result.stdout.lines)
