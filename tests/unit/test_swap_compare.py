"""`gpucluster compare` after a node swap: two 8-node burn-in results (8 GPUs each), node n08
replaced by n09 (which joins in the middle of the host list, so the ranks of n05..n07 shift), and
GPU 5 of the unchanged node n03 lost 20% of its bf16 matmul. That GPU is flagged per host; the new
node is compared with the baseline's median over its hosts; the removed node is listed as missing.

The files are written by the plugin's own Recorder; the per-GPU values are synthetic (this VM has no
GPU): an H100-class 700 TFLOP/s with a deterministic +-1.5% spread across GPUs and three repeats
+-0.5% each, the shape the health job's matmul has.
"""

from __future__ import annotations

import json

from pytest_gpucluster.cli import main
from pytest_gpucluster.results.model import Check, Spread, ThresholdRef
from pytest_gpucluster.results.recorder import Recorder

PEAK = 700e12
FLOOR = ThresholdRef("h100-sxm", ("burnin", "min_matmul"))


def write_run(path, hosts, slow=None):
    """One 8-GPU-per-node run: ``slow`` = (host, gpu, factor)."""
    recorder = Recorder(path, header={"fingerprint": {"hosts": list(hosts)}})
    recorder.current_test = "acceptance/test_burnin.py::test_gpu_health"
    checks = []
    for index, host in enumerate(hosts):
        node = int(host[1:])
        for gpu in range(8):
            value = PEAK * (1 + 0.015 * (((node * 8 + gpu) * 37) % 7 - 3) / 3)
            if slow and (host, gpu) == slow[:2]:
                value *= slow[2]
            repeats = [value * 0.995, value, value * 1.005]
            checks.append(
                Check(
                    "burnin.gpu_matmul", value, "FLOP/s", 400e12, ">=", FLOOR,
                    labels={"host": host, "rank": index * 8 + gpu, "gpu": f"GPU {gpu}"},
                    spread=Spread.of(repeats),
                )
            )  # fmt: skip
    recorder.record_checks(checks, test_id=recorder.current_test)
    return path


def test_a_gpu_that_lost_a_fifth_of_its_matmul_on_an_unchanged_node_is_flagged_per_host(tmp_path, capsys):
    before = [f"n{i:02d}" for i in range(1, 9)]
    after = ["n01", "n02", "n03", "n04", "n09", "n05", "n06", "n07"]  # n08 out, n09 in, ranks shift
    old = write_run(tmp_path / "old.json", before)
    new = write_run(tmp_path / "new.json", after, slow=("n03", 5, 0.8))
    assert main(["compare", str(old), str(new)]) == 1
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("REGRESSION", "ok ", "improved", "info"))]
    regressions = [line for line in rows if line.startswith("REGRESSION")]
    assert len(regressions) == 1
    assert (
        "burnin.gpu_matmul" in regressions[0]
        and "host=n03" in regressions[0]
        and "gpu=GPU 5" in regressions[0]
    )
    assert regressions[0].rstrip().endswith("per host")
    assert "-20.0%" in regressions[0]
    # 56 GPUs on the 7 unchanged nodes, compared per host (n05..n07 under new ranks); n09's 8 with the fleet
    assert sum(line.rstrip().endswith("per host") for line in rows) == 56
    assert sum(line.rstrip().endswith("new host vs baseline median") for line in rows) == 8
    assert all("host=n09" in line for line in rows if line.rstrip().endswith("new host vs baseline median"))
    assert "missing from this run (8): burnin.gpu_matmul||gpu=GPU 0,host=n08,rank=56;" in out
    assert out.count("n09 is not in the baseline") == 1  # one note for the 8 rows it explains
    assert (
        "burnin.gpu_matmul (8 rows): n09 is not in the baseline: compared with the baseline's 64 value(s)"
        in out
    )
    assert "compared: the hosts differ; values that name their host are compared per host" in out
    assert json.loads(new.read_text())["fingerprint"]["hosts"] == after


def test_the_report_says_which_comparison_each_row_used(tmp_path):
    from pytest_gpucluster.results.baseline import compare_runs, read_results
    from pytest_gpucluster.results.report import write_reports

    before = [f"n{i:02d}" for i in range(1, 9)]
    after = ["n01", "n02", "n03", "n04", "n09", "n05", "n06", "n07"]
    old = read_results(write_run(tmp_path / "old.json", before))
    new = read_results(write_run(tmp_path / "new.json", after, slow=("n03", 5, 0.8)))
    files = write_reports(new, tmp_path / "report", compare_runs(old, new, 0.05))
    text = files.markdown.read_text()
    regression = next(line for line in text.splitlines() if "REGRESSION" in line and "host=n03" in line)
    assert "gpu=GPU 5" in regression and "per host" in regression
    assert "n09 is not in the baseline" in text


def test_the_swap_on_a_real_run_fanned_out_to_8_nodes_flags_the_one_slow_gpu_per_host(tmp_path, capsys):
    """The same swap on real values: a real cpu-local suite run (tests/data/results/cpu_local_run.json)
    fanned out to 8 nodes x 8 ranks twice (independent ±1% noise), node008 replaced by node009 in the
    middle of the host list, and rank 5 of the unchanged node003 at 80% of its real matmul. Gated at
    a flat 10% (the run's own cpu-local rules allow burnin.* 60%, this VM's measured noise)."""
    from pathlib import Path

    from pytest_gpucluster.testbed.fanout import dumps, fan_out

    real = json.loads((Path(__file__).parents[1] / "data" / "results" / "cpu_local_run.json").read_text())
    old, _ = fan_out(real, 8, 8, noise=0.01, seed=1, plant=False)
    new, _ = fan_out(real, 8, 8, noise=0.01, seed=2, plant=False)
    slow = 0
    for m in new["measurements"]:
        labels = m.get("labels") or {}
        if labels.get("host") == "node008":
            labels["host"] = "node009"
        if m["metric"] == "burnin.cpu_matmul" and (labels.get("host"), labels.get("gpu")) == ("node003", "5"):
            m["value"] *= 0.8
            if spread := m.get("spread"):
                spread.update({k: spread[k] * 0.8 for k in ("median", "min", "max", "mad")})
                spread["values"] = [v * 0.8 for v in spread["values"]]
            slow += 1
    assert slow == 1
    hosts = ["node001", "node002", "node003", "node004", "node009", "node005", "node006", "node007"]
    new["fingerprint"]["hosts"] = hosts
    new["regression"]["tolerances"]["rules"] = []
    (tmp_path / "old.json").write_text(dumps(old))
    (tmp_path / "new.json").write_text(dumps(new))

    assert (
        main(["compare", str(tmp_path / "old.json"), str(tmp_path / "new.json"), "--max-regression", "10%"])
        == 1
    )
    rows = capsys.readouterr().out.splitlines()
    regressions = [line for line in rows if line.startswith("REGRESSION")]
    assert len(regressions) == 1, regressions
    assert "burnin.cpu_matmul (host=node003,rank=21,gpu=5)" in regressions[0]
    assert regressions[0].rstrip().endswith("per host")
    matmul = [
        line for line in rows if line.startswith(("ok", "REGRESSION")) and "burnin.cpu_matmul (" in line
    ]
    assert sum(line.rstrip().endswith("per host") for line in matmul) == 56
    assert sum(line.rstrip().endswith("new host vs baseline median") for line in matmul) == 8
