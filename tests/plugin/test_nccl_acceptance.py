"""acceptance/test_nccl.py run whole (pytester): recorded logs pass or fail by profile, the launched
variant skips without NCCL and, with a stand-in cluster, reads every rank's log; nccl_env warns on typos."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from acceptance_runs import acceptance_run, results
from node_fakes import use_machine

from pytest_gpucluster.profiles.detect import MachineInfo

REPO = Path(__file__).resolve().parents[2]
ACCEPTANCE = REPO / "acceptance" / "test_nccl.py"
LOGS = REPO / "tests" / "data" / "nccl_logs"
EFA = LOGS / "efa_libfabric_aws_ofi_2.27.3.log"  # seed 003's rank-0 block
SOCKET_NO_PLUGIN = LOGS / "plugin_missing_socket_2.21.5_nccl1653.log"
SEED = REPO.parent / "shared" / "seeds" / "003_3b852299fd233ee4.txt"

NO_GPU = MachineInfo(
    hostname="testhost",
    cuda_available=False,
    reasons={
        "cuda": "no CUDA device on testhost (no nvidia-smi, no /dev/nvidia*)",
        "nccl": "no CUDA device on testhost (no nvidia-smi, no /dev/nvidia*)",
    },
)
# What the gpucluster(needs=["nccl"]) marker looks at; cuda_available stays False so that the session's
# fingerprint does not import torch to read CUDA and NCCL versions.
NCCL_NODE = MachineInfo(
    hostname="testhost",
    cuda_available=False,
    gpu_names=("NVIDIA L40S",) * 4,
    capabilities=frozenset({"cuda", "nccl"}),
)

# Stands in for the cluster: "runs" the probe by copying real logs where the ranks would write theirs.
FAKE_CLUSTER = """
import json
import shutil
from pathlib import Path

import pytest

RANK_LOGS = {rank_logs!r}


class FakeJob:
    def __init__(self, job_dir, values):
        self.job_id = job_dir.name
        self.job_dir = job_dir
        self.values = values


class FakeCluster:
    def run(self, workload, **kwargs):
        job_dir = Path("jobs") / "nccl-probe-1"
        job_dir.mkdir(parents=True)
        (job_dir / "call.json").write_text(json.dumps({{"workload": workload, **kwargs}}, default=str))
        values = []
        for rank, source in enumerate(RANK_LOGS):
            log = job_dir / f"nccl-rank-{{rank}}.log"
            shutil.copyfile(source, log)
            values.append({{"host": f"node{{rank}}", "nccl_log": str(log.resolve())}})
        return FakeJob(job_dir.resolve(), values)


@pytest.fixture(scope="session")
def cluster():
    return FakeCluster()
"""


@pytest.fixture
def run(pytester, tmp_path, monkeypatch):
    use_machine(monkeypatch, NO_GPU)
    return acceptance_run(pytester, monkeypatch, tmp_path, {"test_nccl": ACCEPTANCE})


def measurements(tmp_path: Path) -> dict[str, dict]:
    return {m["metric"]: m for m in results(tmp_path)["measurements"]}


def test_seed_log_passes_for_the_efa_profile(run, tmp_path):
    result = run("--hw=aws-g6e-efa", f"--nccl-log={EFA}")
    result.assert_outcomes(passed=7)
    got = measurements(tmp_path)
    assert sorted(got) == [
        "nccl.errors",
        "nccl.gdr",
        "nccl.net_plugin",
        "nccl.net_plugin_version",
        "nccl.network",
        "nccl.provider",
        "nccl.ranks_agree",
        "nccl.version",
    ]
    assert {m["verdict"] for m in got.values()} == {"pass"}
    assert got["nccl.network"]["labels"] == {"expected": "Libfabric", "found": "Libfabric"}
    assert got["nccl.net_plugin"]["labels"]["found"] == "aws-ofi-nccl 1.16.2 (Libfabric)"
    assert got["nccl.errors"]["value"] == 0
    assert got["nccl.ranks_agree"]["labels"] == {"ranks": 4, "differ_on": "nothing"}


def test_same_log_fails_spectrum_x_quoting_network_and_plugin_lines(run, tmp_path):
    result = run("--hw=h200-spectrumx", f"--nccl-log={EFA}", "--tb=line")
    result.assert_outcomes(passed=3, failed=3)
    result.stdout.fnmatch_lines(
        [
            "*nccl.network (expected=IB, found=Libfabric): *The log says *efa_libfabric_aws_ofi_2.27.3.log:81: "
            "llama-3-8b-node-0-0:194:724 [[]3] NCCL INFO Using network Libfabric*",
            "*nccl.net_plugin (expected=none, found=aws-ofi-nccl 1.16.2 (Libfabric)): *The log says "
            "*:17: * NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v10)*NCCL_NET_PLUGIN*",
            "*nccl.gdr (expected=on, found=off): *disabling GDR*",
        ]
    )
    got = measurements(tmp_path)
    failed = sorted(name for name, m in got.items() if m["verdict"] == "fail")
    assert failed == ["nccl.gdr", "nccl.net_plugin", "nccl.network"]
    data = results(tmp_path)
    assert {o["category"] for o in data["outcomes"] if o["outcome"] == "failed"} == {"performance"}


@pytest.mark.skipif(not SEED.is_file(), reason=f"the seed file {SEED} is not beside this checkout")
def test_the_seed_file_itself_with_its_prose_around_the_log(run):
    run("--hw=aws-g6e-efa", f"--nccl-log={SEED}").assert_outcomes(passed=7)
    run("--hw=h200-spectrumx", f"--nccl-log={SEED}").assert_outcomes(passed=3, failed=3)


def test_without_nccl_and_without_a_log_the_launched_variant_skips_naming_what_is_missing(run):
    result = run("--hw=aws-g6e-efa")
    result.assert_outcomes(skipped=7)
    result.stdout.fnmatch_lines(
        [
            "SKIPPED [[]7] *needs nccl: node testhost: lists no GPU (no CUDA device on testhost (no nvidia-smi, no /dev/nvidia*))"
        ]
    )


def test_several_files_by_glob_name_the_rank_without_the_plugin(run, tmp_path):
    job = tmp_path / "job-logs"
    job.mkdir()
    shutil.copyfile(EFA, job / "node0.log")
    shutil.copyfile(SOCKET_NO_PLUGIN, job / "node1.log")
    result = run("--hw=aws-g6e-efa", f"--nccl-log={job}/*.log", "--tb=line")
    result.assert_outcomes(passed=6, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*nccl.ranks_agree (ranks=5, differ_on=*agreement.network*agreement.net_plugin*"
            "rank 0 (DESKTOP-1CE5APL:2852[[]0]) says 'Socket'*node1.log:9: *Using network Socket*"
            "rank 0 (DESKTOP-1CE5APL:2852[[]0]) loaded no plugin*node1.log:1: *Plugin load returned 2*"
        ]
    )


def test_a_log_path_that_matches_nothing_fails_naming_it(run, tmp_path):
    result = run("--hw=aws-g6e-efa", f"--nccl-log={tmp_path}/missing.log")
    result.assert_outcomes(errors=7)
    result.stdout.fnmatch_lines([f"*--nccl-log {tmp_path}/missing.log: no such file*"])


def test_a_profile_without_an_nccl_section_skips_the_expectations(run):
    result = run("--hw=cpu-local", f"--nccl-log={EFA}")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(
        ["SKIPPED*profile cpu-local has no nccl: section, so there is nothing to compare the NCCL log with"]
    )


def test_launched_variant_reads_every_rank_log_and_warns_on_nccl_env_typos(
    run, pytester, tmp_path, monkeypatch
):
    use_machine(monkeypatch, NCCL_NODE)
    monkeypatch.setenv("NCCL_IB_HCAS", "mlx5_0")
    pytester.makeconftest(FAKE_CLUSTER.format(rank_logs=[str(EFA), str(EFA)]))
    result = run("--hw=aws-g6e-efa", "-W", "always::pytest_gpucluster.errors.GpuClusterWarning")
    result.assert_outcomes(passed=7)
    result.stdout.fnmatch_lines(
        [
            "*GpuClusterWarning: NCCL_IB_HCAS is not an NCCL environment variable, so NCCL ignores it; "
            "did you mean NCCL_IB_HCA? (set in the environment)"
        ]
    )
    call = json.loads((pytester.path / "jobs" / "nccl-probe-1" / "call.json").read_text())
    assert call["workload"] == "pytest_gpucluster.workloads.nccl_probe:probe"
    assert call["init_process_group"] is False
    assert call["nodes"] == 1
    assert call["env"]["NCCL_DEBUG"] == "INFO"
    assert call["env"]["NCCL_DEBUG_SUBSYS"] == "INIT,NET,ENV"
    assert call["env"]["NCCL_IB_HCAS"] == "mlx5_0"
    data = results(tmp_path)
    assert data["nccl_env"]["NCCL_IB_HCAS"] == "mlx5_0"
    got = measurements(tmp_path)
    assert got["nccl.network"]["verdict"] == "pass"


NETWORK_NOT_FOUND = LOGS / "network_not_found_ofi_cscs_docs.log"  # its only problem is one WARN line
IBV_CREATE_QP = LOGS / "ibv_create_qp_ibext_2.8.3_nccl562.log"
BENIGN_WARN = LOGS / "collnet_ignored_warn_gdrdma_p2p_read_nccl_tests133.log"


def test_a_failing_warn_fails_the_run_quoting_the_line(run, tmp_path):
    """GPU behaviour: a node whose aws-ofi-nccl plugin is missing makes NCCL print
    ``net.cc:626 NCCL WARN Error: network AWS Libfabric not found.`` -- a WARN, yet the job cannot
    communicate. ``--nccl-log`` of that log fails ``test_nccl_reported_no_errors`` and the failure
    quotes the file, the line number and the line."""
    result = run("--hw=cpu-local", f"--nccl-log={NETWORK_NOT_FOUND}", "--tb=line")
    result.assert_outcomes(failed=1, skipped=2)  # one rank: nothing to compare; no nccl: section
    result.stdout.fnmatch_lines(
        [
            "*nccl.errors (found=1 error line(s): network not found): measured 1 lines, expected at most 0*"
            "the log says *network_not_found_ofi_cscs_docs.log:3: nid006365:180142:180163 [[]0] net.cc:626 "
            "NCCL WARN Error: network AWS Libfabric not found.*Next: read the quoted lines*"
        ]
    )
    got = measurements(tmp_path)
    assert (got["nccl.errors"]["verdict"], got["nccl.errors"]["value"]) == ("fail", 1)


def test_verbs_failures_on_several_ranks_quote_the_first_line_of_each(run):
    """GPU behaviour: ``ibv_create_qp`` failing on three GPUs of one A100 node (NCCL 2.8.3): the
    failure names the kind (verbs call) and quotes the first rank's WARN line."""
    result = run("--hw=aws-g6e-efa", f"--nccl-log={IBV_CREATE_QP}", "-k", "errors", "--tb=line")
    result.assert_outcomes(failed=1, deselected=6)
    result.stdout.fnmatch_lines(
        [
            "*nccl.errors (found=3 error line(s): verbs call failed)*ibv_create_qp_ibext_2.8.3_nccl562.log:4: "
            "hai-a100-3:3778851:3779883 [[]4] ibvwrap.c:130 NCCL WARN Call to ibv_create_qp failed*"
        ]
    )


def test_a_benign_warn_does_not_fail_the_run(run, tmp_path):
    """GPU behaviour: NCCL 2.1x on two 8-GPU nodes prints ``NCCL WARN CollNet is not supported or fails
    to initialize, ignoring NCCL_ALGO=COLLNET`` and carries on over IB with GDRDMA: not an error."""
    run("--hw=cpu-local", f"--nccl-log={BENIGN_WARN}", "-k", "errors").assert_outcomes(passed=1, deselected=2)
    assert measurements(tmp_path)["nccl.errors"]["verdict"] == "pass"
