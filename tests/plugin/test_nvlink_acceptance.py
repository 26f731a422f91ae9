"""acceptance/test_nvlink.py run whole (pytester).

On this CPU machine under cpu-local, the NVLink tests skip naming the missing capability and the
shm-vs-gloo speedup runs for real (torchrun, gloo, DeepSpeed's shm op); with a copied profile that
demands an impossible speedup it fails with the measured ratio and the threshold. With a stand-in
cluster that answers from recorded nvidia-smi outputs and NCCL logs, a DGX H100 profile passes on a
healthy node and, on a degraded one, every failure names the pair, link or GPU at fault.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from acceptance_runs import acceptance_run, measurements, results
from node_fakes import use_machine

from pytest_gpucluster.profiles.detect import MachineInfo
from pytest_gpucluster.results.text import format_value

REPO = Path(__file__).resolve().parents[2]
ACCEPTANCE = REPO / "acceptance" / "test_nvlink.py"
SMI = REPO / "tests" / "data" / "nvidia_smi"
NCCL_LOGS = REPO / "tests" / "data" / "nccl_logs"
WHY = "no CUDA device on testhost (no nvidia-smi, no /dev/nvidia*)"
# As the marks say it, judged on the node's probe: the node is named, then what it lacks.
NO_GPU_LISTED = f"node testhost: lists no GPU ({WHY})"
NO_NVLINK = f"node testhost: NVLink state needs NVML ({WHY})"
# pytester points HOME at a fresh directory, where DeepSpeed would build its shm op again (~30 s, minutes
# on a busy machine): the ranks keep the cache directory the CI prebuilds it in (torch's default build
# root is $XDG_CACHE_HOME/torch_extensions/py311_cpu), read before pytester moves HOME.
CACHE_HOME = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")

NO_GPU = MachineInfo(
    hostname="testhost",
    cuda_available=False,
    reasons={"cuda": WHY, "nccl": WHY, "nvml": WHY, "nvlink": WHY},
)
# What the gpucluster(needs=[...]) markers look at; cuda_available stays False so that the session's
# fingerprint does not import torch to read CUDA and NCCL versions.
NVLINK_NODE = MachineInfo(
    hostname="testhost",
    cuda_available=False,
    gpu_names=("NVIDIA H100 80GB HBM3",) * 8,
    capabilities=frozenset({"cuda", "nccl", "nvml", "nvlink"}),
    reasons={"multi-node": "one node"},
)

# Stands in for the cluster: answers each workload as 8 H100s would, from recorded nvidia-smi text
# and the numbers in SCENARIO; records every call.
FAKE_CLUSTER = """
import json
from pathlib import Path

import pytest

SCENARIO = {scenario!r}


class FakeJob:
    def __init__(self, job_id, values):
        self.job_id = job_id
        self.job_dir = Path("jobs", job_id).resolve()
        self.values = values


def gpus():
    out = {{}}
    for gpu in range(8):
        links = {{str(n): {{"active": True, "speed_gbs": 26.562, "version": 4}} for n in range(18)}}
        for link, speed in SCENARIO["links"].get(str(gpu), {{}}).items():
            links[link] = {{"active": speed is not None, "speed_gbs": speed, "version": 4}}
        out[str(gpu)] = {{"name": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:{{gpu:02X}}:00.0", "links": links}}
    return out


def traffic(rank):
    expected = 10 * (256 << 20) * 2 * 7 / 8
    share = SCENARIO["counters"].get(str(rank), 1.0)
    per_link = int(expected * share / 18)
    links = {{str(n): {{"tx_bytes": per_link, "rx_bytes": per_link}} for n in range(18)}}
    return {{
        "host": "testhost", "rank": rank, "local_rank": rank, "node_rank": 0,
        "gpu": {{"name": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:{{rank:02X}}:00.0", "cuda_index": rank}},
        "counter_source": "NVML field values NVLINK_THROUGHPUT_DATA_TX/RX", "links": links,
        "tx_bytes": per_link * 18, "rx_bytes": per_link * 18, "size_bytes": 256 << 20, "iters": 10,
        "node_ranks": 8, "expected_bytes": expected, "elapsed_s": 0.05,
    }}


def sweep(rank, options, time_us):
    size = options["min_bytes"]
    cell = {{"times_us": [time_us * f for f in (1.0, 0.98, 1.03)], "lag_us": [0.0] * 3, "wrong": None}}
    points = []
    while size <= options["max_bytes"]:
        points.append({{"size_bytes": size, "count": size // 4, "out_of_place": cell}})
        size *= options.get("factor", 2)
    return {{"collective": "all_reduce", "nranks": 8, "rank": rank, "points": points}}


class FakeCluster:
    def __init__(self):
        self.calls = []

    def run(self, workload, **kwargs):
        self.calls.append({{"workload": workload, **kwargs}})
        Path("calls.json").write_text(json.dumps(self.calls, default=str))
        job_id = f"job{{len(self.calls)}}"
        name = workload.rpartition(":")[2]
        if name == "inventory":
            topo = Path(SCENARIO["topo"]).read_text()
            return FakeJob(job_id, [{{"host": "testhost", "rank": 0, "links_source": "NVML", "gpus": gpus(),
                                     "topo_text": topo, "topo_error": None}}])
        if name == "traffic":
            return FakeJob(job_id, [traffic(rank) for rank in range(8)])
        env = kwargs["env"] or {{}}
        log = None
        if env.get("NCCL_SHM_DISABLE") == "1":
            time_us = SCENARIO["isolated_us"]
        elif env.get("NCCL_P2P_DISABLE") == "1":
            time_us, log = SCENARIO["p2p_off_us"], SCENARIO["slow_log"]
        else:
            time_us, log = SCENARIO["default_us"], SCENARIO["fast_log"]
        job = FakeJob(job_id, [sweep(rank, kwargs["options"], time_us) for rank in range(8)])
        if log is not None:  # the rank log holds NCCL's INFO lines: a recorded one
            job.job_dir.mkdir(parents=True)
            (job.job_dir / "rank-0.log").write_text(Path(log).read_text())
        return job


@pytest.fixture(scope="session")
def cluster():
    return FakeCluster()
"""

HEALTHY = {
    "topo": str(SMI / "topo_dgx_h100_13nic.txt"),
    "links": {},
    "counters": {},
    "default_us": 100.0,
    "p2p_off_us": 400.0,
    "isolated_us": 110.0,
    "fast_log": str(NCCL_LOGS / "p2p_cumem_socket_2.28.9.log"),
    "slow_log": str(NCCL_LOGS / "p2p_disabled_shm_gdr1_ring_vllm_2.28.9.log"),
}
# 16 MiB in 100 us on 8 ranks is 16777216 / 100e-6 x 2*7/8 = 293.6 GB/s busbw; in 400 us, 73.4 GB/s.
DEGRADED = {
    "topo": str(SMI / "topo_h100_4gpu_nv6_issue_excerpt.txt"),
    "links": {"3": {"7": None}, "1": {"2": 13.281}},
    "counters": {"5": 0.0, "2": 0.3},
    "default_us": 100.0,
    "p2p_off_us": 125.0,
    "isolated_us": 300.0,
    "fast_log": str(NCCL_LOGS / "p2p_cumem_socket_2.28.9.log"),
    "slow_log": str(NCCL_LOGS / "nvls_used_gdrdma_2node_bracket_ts_k8s.log"),  # the slow side on NVLink
}

DGX_EXTRA = """
name: dgx-h100-ib-nvlink-test
description: dgx-h100-ib with every nvlink threshold set
extends: dgx-h100-ib
nvlink:
  min_counter_fraction: 80%
  min_busbw: 200GB/s
  isolated_intra_min_busbw: 200GB/s
  isolated_inter_min_busbw: 40GB/s
"""

IMPOSSIBLE = """
name: cpu-local-impossible
description: cpu-local demanding a shared-memory speedup no machine has
extends: cpu-local
nvlink:
  speedup_sizes: [1MiB]
  min_speedup: 1000
"""


@pytest.fixture
def run(pytester, tmp_path, monkeypatch):
    use_machine(monkeypatch, NO_GPU)
    monkeypatch.setenv("XDG_CACHE_HOME", CACHE_HOME)
    return acceptance_run(pytester, monkeypatch, tmp_path, {"test_nvlink": ACCEPTANCE})


def test_cpu_local_skips_nvlink_tests_naming_the_capability_and_gates_the_real_shm_speedup(
    run, pytester, tmp_path
):
    """The real shm-vs-gloo job (a few seconds once DeepSpeed's op is built), against a copied profile
    whose min_speedup no machine reaches: the failure gives the measured ratio and the threshold."""
    profile = pytester.path / "cpu-local-impossible.yaml"
    profile.write_text(IMPOSSIBLE)
    result = run(f"--hw={profile}", "--tb=line")
    result.assert_outcomes(failed=1, skipped=5)
    result.stdout.fnmatch_lines_random(
        [
            f"SKIPPED [[]2[]] *needs nvlink: {NO_NVLINK}",
            f"SKIPPED [[]2[]] *needs nccl: {NO_GPU_LISTED}; needs nvlink: {NO_NVLINK}",
            f"SKIPPED [[]1[]] *needs nccl: {NO_GPU_LISTED}; needs multi-node: the cluster has 1 node*",
        ]
    )
    got = measurements(tmp_path)
    [speedup] = [m for m in got if m["metric"] == "nvlink.speedup"]
    busbw = {m["labels"]["transport"]: m["value"] for m in got if m["metric"] == "nvlink.speedup.busbw"}
    assert speedup["labels"] == {"size_bytes": 1 << 20, "pair": "shm/gloo"}
    assert (speedup["verdict"], speedup["threshold"], speedup["unit"]) == ("fail", 1000.0, "x")
    assert sorted(busbw) == ["gloo", "shm"] and all(v > 0 for v in busbw.values())
    assert speedup["value"] == pytest.approx(busbw["shm"] / busbw["gloo"])
    assert speedup["ref"] == {"profile": "cpu-local-impossible", "key_path": ["nvlink", "min_speedup"]}
    result.stdout.fnmatch_lines(
        [
            "*nvlink.speedup [[]intra-node[]] (size_bytes=1048576, pair=shm/gloo): "
            f"measured {format_value(speedup['value'], 'x')}, expected at least 1000 x "
            "(threshold from profile cpu-local-impossible: nvlink.min_speedup)*"
            "the 1-minute load average after the job was * on * CPUs."
        ]
    )
    data = results(tmp_path)
    failed = [o for o in data["outcomes"] if o["outcome"] == "failed"]
    assert [o["category"] for o in failed] == ["performance"]


def test_a_profile_without_nvlink_settings_skips_the_speedup_naming_the_key(run, pytester):
    profile = pytester.path / "cpu-no-speedup.yaml"
    profile.write_text(
        "name: cpu-no-speedup\ndescription: no nvlink section\nextends: cpu-local\nnvlink: null\n"
    )
    result = run(f"--hw={profile}", "-k", "speedup")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*profile cpu-no-speedup has no nvlink: section*"])


def _gpu_run(run, pytester, monkeypatch, scenario: dict):
    use_machine(monkeypatch, NVLINK_NODE)
    pytester.makeconftest(FAKE_CLUSTER.format(scenario=scenario))
    profile = pytester.path / "dgx-h100-ib-nvlink-test.yaml"
    profile.write_text(DGX_EXTRA)
    result = run(f"--hw={profile}", "--tb=line")
    calls = json.loads((pytester.path / "calls.json").read_text())
    return result, calls


def test_a_healthy_nvlink_node_passes_every_check(run, pytester, monkeypatch, tmp_path):
    result, calls = _gpu_run(run, pytester, monkeypatch, HEALTHY)
    result.assert_outcomes(passed=5, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*needs multi-node*"])
    by_name = {c["name"]: c for c in calls}
    assert by_name["nvlink-inventory"]["nproc_per_node"] == 1
    assert by_name["nvlink-inventory"]["init_process_group"] is False
    slow_env = by_name["nvlink-speedup-nvlink-off"]["env"]
    assert (slow_env["NCCL_P2P_DISABLE"], slow_env["NCCL_NVLS_ENABLE"], slow_env["NCCL_DEBUG"]) == (
        "1",
        "0",
        "INFO",
    )
    assert "NCCL_P2P_DISABLE" not in (by_name["nvlink-speedup-nccl-p2p"]["env"] or {})
    assert by_name["nvlink-speedup-nccl-p2p"]["nodes"] == 1
    assert by_name["nvlink-speedup-nccl-p2p"]["options"]["min_bytes"] == 16 << 20
    isolated = by_name["nvlink-isolated-intra"]["env"]
    assert (isolated["NCCL_SHM_DISABLE"], isolated["NCCL_P2P_LEVEL"]) == ("1", "NVL")
    got = {(m["metric"], m["labels"].get("transport")): m for m in measurements(tmp_path)}
    assert got[("nvlink.topology_mismatches", None)]["labels"] == {
        "expected": "NV18",
        "nodes": 1,
        "pairs": 28,
    }
    assert got[("nvlink.links_up", None)]["value"] == 18
    assert got[("nvlink.link_speed", None)]["value"] == pytest.approx(26.562e9)
    assert got[("nvlink.counter_fraction", None)]["value"] == pytest.approx(1.0, rel=1e-6)
    assert got[("nvlink.speedup", None)]["value"] == pytest.approx(4.0)
    assert got[("nvlink.speedup.busbw", "nccl-p2p")]["value"] == pytest.approx(16 * 2**20 / 100e-6 * 7 / 4)
    assert got[("nvlink.busbw", "nccl-p2p")]["verdict"] == "pass"
    sides = {
        m["labels"]["side"]: m for m in measurements(tmp_path) if m["metric"].endswith("_nvlink_connections")
    }
    assert (sides["nccl-p2p"]["value"], sides["nccl-nvlink-off"]["value"]) == (2, 0)
    assert sides["nccl-nvlink-off"]["labels"]["env"].startswith("NCCL_MNNVL_ENABLE=0 NCCL_NVLS_ENABLE=0")


def test_a_degraded_node_names_the_pairs_links_and_gpus_at_fault(run, pytester, monkeypatch, tmp_path):
    result, _ = _gpu_run(run, pytester, monkeypatch, DEGRADED)
    result.assert_outcomes(failed=5, skipped=1)
    result.stdout.fnmatch_lines_random(
        [
            "*nvlink.topology_mismatches (expected=NV18, nodes=1, pairs=6): measured 6 GPU pairs, expected at most "
            "0 GPU pairs*Not linked by NV18: testhost GPU0-GPU1 is NV6; testhost GPU0-GPU2 is NV6;*",
            "*nvlink.links_up (gpus=8, min_link_speed=25 GB/s): measured 17 links, expected at least 18 links*"
            "testhost GPU 1: link 2 at 13.281 GB/s; testhost GPU 3: link 7 down*",
            "*nvlink.counter_fraction [[]intra-node[]] *measured 0%, expected at least 80%*"
            "testhost GPU 00000000:02:00.0 (rank 2): 30%*testhost GPU 00000000:05:00.0 (rank 5): counters did not move "
            "(sent 0 B, received 0 B of 4,697,620,480 B; 18 of 18 links idle*",
            "*nvlink.speedup.slow_side_nvlink_connections [[]intra-node[]] (side=nccl-nvlink-off, env=*): measured "
            "35 connections, expected at most 0 connections. slow side still on NVLink: rank-0.log line 41: *"
            "via P2P/IPC (and 34 more P2P/NVLS connection line(s))*",
            "*nvlink.isolated_intra.busbw [[]intra-node[]] *measured 97.87 GB/s, expected at least 200 GB/s*"
            "NCCL_SHM_DISABLE=1 NCCL_P2P_LEVEL=NVL*",
        ]
    )
    got = {m["metric"]: m for m in measurements(tmp_path)}
    assert got["nvlink.link_speed"]["verdict"] == "fail"  # 13.281 GB/s, reported with links_up
    # 1.25 x with the slow side on NVLink is no speedup figure: recorded, not judged
    assert got["nvlink.speedup"]["verdict"] == "info" and got["nvlink.speedup"]["value"] == pytest.approx(
        1.25
    )
    assert got["nvlink.speedup"]["hint"].startswith(
        "Not judged: the nccl-nvlink-off side still ran over NVLink"
    )
    assert got["nvlink.link_speed"]["value"] == pytest.approx(13.281e9)
