"""Plugin behaviour seen from outside: options, precedence, header, skips, errors (pytester)."""

import json

import pytest

INVENTORY_LIKE = """
import pytest

def test_uses_profile(hw, results):
    results.check("demo.value", 2.0, 1.0, unit="x")

@pytest.mark.gpucluster(needs=["nvlink"])
def test_needs_nvlink(hw):
    pass

@pytest.mark.gpucluster(min_nodes=2)
def test_needs_two_nodes(hw):
    pass
"""


@pytest.fixture
def run(pytester, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUCLUSTER_HW", raising=False)
    monkeypatch.delenv("_GPUCLUSTER_SESSION_RESULTS_DIR", raising=False)

    def _run(*args, source=INVENTORY_LIKE):
        pytester.makepyfile(test_demo=source)
        return pytester.runpytest_inprocess("-rs", f"--results-dir={tmp_path / 'res'}", *args)

    return _run


def test_header_names_auto_profile_and_reason(run):
    result = run()
    result.stdout.fnmatch_lines(
        [
            "gpucluster: profile cpu-local (auto: no GPU on the nodes (node *: no NVML *)), 1 node x 2 ranks, "
            "backend gloo, launcher torchrun"
        ]
    )
    assert result.ret == 0


def test_gpu_only_tests_skip_with_exact_reason(run):
    result = run()
    result.stdout.fnmatch_lines(
        [
            "SKIPPED*needs nvlink: *",
            "SKIPPED*needs 2 nodes, the cluster has 1 (local machine only; pass --hostfile)*",
        ]
    )
    result.assert_outcomes(passed=1, skipped=2)


def test_unknown_profile_lists_known_ones(run):
    result = run("--hw=nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*unknown hardware profile 'nope'. Known profiles: *cpu-local*h200-spectrumx*"]
    )


def test_precedence_cli_over_env_over_ini(run, pytester, monkeypatch):
    pytester.makeini("[pytest]\ngpucluster_hw = h800-ib\ngpucluster_nproc_per_node = 3\n")
    monkeypatch.setenv("GPUCLUSTER_HW", "a800-ib")
    result = run("--hw=cpu-local")
    result.stdout.fnmatch_lines(
        ["gpucluster: profile cpu-local (--hw=cpu-local from command line)*x 3 ranks*"]
    )
    result = run()
    result.stdout.fnmatch_lines(
        ["gpucluster: profile a800-ib (--hw=a800-ib from environment GPUCLUSTER_HW)*"]
    )
    monkeypatch.delenv("GPUCLUSTER_HW")
    result = run()
    result.stdout.fnmatch_lines(["gpucluster: profile h800-ib (--hw=h800-ib from ini key gpucluster_hw)*"])


def test_help_shows_every_option_with_its_env_and_ini_key(pytester):
    # A bare '%' in a help text (e.g. "5%") once made argparse raise, and --help crashed.
    result = pytester.runpytest_inprocess("--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "GPU cluster acceptance (pytest-gpucluster):",
            "*--hw=PROFILE|PATH*",
            "*--max-regression=PERCENT*",
            "*e.g. 5%, for metrics*",
            "*GPUCLUSTER_REGRESSION_GATE, ini*",
            "*--gpucluster-drain*",
            "*gpucluster_max_regression (string):*",
        ]
    )


def test_bad_option_value_names_its_source(run, monkeypatch):
    monkeypatch.setenv("GPUCLUSTER_NNODES", "0")
    result = run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--nnodes: expected a positive integer, got '0' (from environment GPUCLUSTER_NNODES)*"]
    )


def test_malformed_profile_is_a_usage_error_naming_file_and_line(run, tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: broken\ndescription: x\ncluster:\n  device: cpu\n  backend: gloo\n  nodez: 2\n")
    result = run(f"--hw={bad}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*broken.yaml, line 6, key 'cluster.nodez': unknown key (allowed here: nodes,*"]
    )


def test_results_json_records_measurements_and_outcomes(run, tmp_path):
    result = run()
    assert result.ret == 0
    data = json.loads((tmp_path / "res" / "results.json").read_text())
    assert data["profile"]["name"] == "cpu-local"
    [m] = data["measurements"]
    assert (m["metric"], m["value"], m["threshold"], m["verdict"]) == ("demo.value", 2.0, 1.0, "pass")
    categories = sorted(o["category"] for o in data["outcomes"])
    assert categories == ["pass", "skipped", "skipped"]


def test_threshold_failure_is_a_performance_failure(run, tmp_path):
    source = (
        'def test_slow(results):\n    results.check("demo.busbw", 1e9, 2e9, unit="B/s", scope="intra-node")\n'
    )
    result = run(source=source)
    result.stdout.fnmatch_lines(["*demo.busbw [[]intra-node]: measured 1 GB/s, expected at least 2 GB/s*"])
    result.stdout.fnmatch_lines(
        ["FAIL*demo.busbw [[]intra-node]*1 GB/s*>= 2 GB/s", "tests: 1 below threshold"]
    )
    data = json.loads((tmp_path / "res" / "results.json").read_text())
    assert data["outcomes"][0]["category"] == "performance"


def test_a_threshold_with_no_value_fails_as_not_measured(run, tmp_path):
    source = 'def test_gap(results):\n    results.check("demo.mfu", float("nan"), 0.4, unit="fraction")\n'
    result = run(source=source)
    result.stdout.fnmatch_lines(["NOT MEASURED*demo.mfu*n/a*>= 40%", "tests: 1 not measured"])
    data = json.loads((tmp_path / "res" / "results.json").read_text())
    assert data["outcomes"][0]["category"] == "not measured"
    assert data["measurements"][0]["problem"] == "not measured"


def test_secrets_never_reach_results(run, tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("NCCL_API_TOKEN", "hunter2")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    run()
    text = (tmp_path / "res" / "results.json").read_text()
    assert "eth0" in text
    assert "hunter2" not in text and "hf_secret" not in text


def test_plain_tests_leave_no_results(pytester, tmp_path):
    pytester.makepyfile(test_plain="def test_x():\n    assert 1\n")
    result = pytester.runpytest_inprocess(f"--results-dir={tmp_path / 'res'}")
    assert result.ret == 0
    assert not (tmp_path / "res").exists()
    assert "gpucluster summary" not in result.stdout.str()


def test_inside_a_slurm_allocation_the_nodes_are_the_allocations(run, monkeypatch, capsys):
    """``salloc -N 2`` then plain ``pytest``: the launcher defaults to slurm, so the session tests the
    allocation's two nodes (not the login node it runs on) at the profile's ranks per node (a login
    shell has no SLURM_GPUS_ON_NODE, no tasks per node), and the header says why; the dry run prints
    the probe's and the job's srun commands. An explicit --launcher keeps its word, and a pytest
    inside a step (a rank) is not the controller."""
    for key in ("SLURM_STEP_ID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_GPUS_ON_NODE"):
        monkeypatch.delenv(key, raising=False)
    for key in ("GPUCLUSTER_LAUNCHER", "GPUCLUSTER_RANK_SIDE", "GPUCLUSTER_NPROC_PER_NODE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[07-08]")
    source = (
        "def test_x(cluster):\n    cluster.run('pytest_gpucluster.workloads.basic:all_reduce_sum', nodes=2)\n"
    )
    result = run("--hw=cpu-local", "--gpucluster-dry-run", "-v", source=source)  # -v: the commands
    result.stdout.fnmatch_lines(
        [
            "gpucluster: profile cpu-local (*), 2 nodes x 2 ranks, backend gloo, launcher slurm "
            "(inside Slurm allocation 4242 (SLURM_JOB_NODELIST set, no --hostfile))",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    probe = [line for line in out if "[dry run] probe: gpu07: " in line]
    assert probe and " srun " in probe[0] and "--nodelist=gpu07,gpu08" in probe[0], probe
    job = [line for line in out if "[dry run] gpu07: " in line]
    assert job and " srun " in job[0] and "--nproc-per-node=2 " in job[0], out
    explicit = run("--hw=cpu-local", "--launcher=torchrun", "--gpucluster-dry-run", source=source)
    explicit.stdout.fnmatch_lines(
        ["gpucluster: profile cpu-local (*), 1 node x 2 ranks, backend gloo, launcher torchrun"]
    )
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    in_step = run("--hw=cpu-local", "--gpucluster-dry-run", source=source)
    in_step.stdout.fnmatch_lines(["*launcher torchrun"])
