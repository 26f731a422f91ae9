"""`gpucluster report` re-judges a results.json from its evidence: an 8-node fan-out of a real run
(testbed/fanout.py) from which every measurement of one GPU was removed signs NOT FIT, naming that
node and GPU as not measured, although the file itself says nothing about them."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_gpucluster import cli
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.profiles.snapshot import profile_of_snapshot, snapshot
from pytest_gpucluster.results.baseline import read_results
from pytest_gpucluster.results.rejudge import rejudge
from pytest_gpucluster.testbed.fanout import dumps, fan_out

REAL_RUN = Path(__file__).parents[1] / "data" / "results" / "cpu_local_run.json"
H200_RUN = Path(__file__).parents[1] / "data" / "gpu_session" / "h200_2026_11_28" / "quick" / "results.json"


def _fleet(tmp_path: Path, source: Path, gpus: int, cut: tuple[str, str] | None, noise: float = 0.02) -> Path:
    fanned, _ = fan_out(json.loads(source.read_text()), 8, gpus, plant=False, noise=noise)
    if cut is not None:
        fanned["measurements"] = [
            m for m in fanned["measurements"]
            if ((m.get("labels") or {}).get("host"), str((m.get("labels") or {}).get("gpu"))) != cut
        ]  # fmt: skip
    path = tmp_path / f"{source.parent.name}-{gpus}-{'cut' if cut else 'full'}" / "results.json"
    path.parent.mkdir()
    path.write_text(dumps(fanned))
    return path


def test_the_real_h200_run_fanned_to_8_nodes_signs_not_fit_when_one_gpu_lost_its_values(tmp_path, capsys):
    """The real H200 quick run (one node, one GPU), fanned out to 8 such nodes: whole, nothing is
    missing; with every measurement of node004's GPU 0 removed, the report names it."""
    full = _fleet(tmp_path, H200_RUN, 1, None)
    cut = _fleet(tmp_path, H200_RUN, 1, ("node004", "0"))
    assert rejudge(read_results(full)).coverage.to_json()["not_measured_where"] == []
    missing = rejudge(read_results(cut)).coverage.to_json()["not_measured_where"]
    assert {(w["host"], w["gpu"]) for w in missing} == {("node004", "0")}
    assert {w["key"] for w in missing} >= {"burnin.min_matmul", "burnin.min_memory_bandwidth"}
    assert cli.main(["report", str(cut)]) == 0
    assert "re-judged from the evidence" in capsys.readouterr().err
    report = (cut.parent / "report.md").read_text()
    assert "**NOT FIT" in report and "1 of 8 node(s) fail: node004" in report
    row = next(line for line in report.splitlines() if line.startswith("| node004 |"))
    assert "GPU 0: profile.burnin." in row and "FAIL" in row
    assert "| NOT MEASURED | profile.burnin.min_matmul (host=node004,gpu=0) |" in report


def test_per_gpu_values_of_a_fleet_of_8_gpu_nodes_are_judged_per_gpu(tmp_path):
    """The real cpu-local run fanned to 8 nodes x 8 GPUs (its per-rank values become per-GPU ones)."""
    full, cut = _fleet(tmp_path, REAL_RUN, 8, None), _fleet(tmp_path, REAL_RUN, 8, ("node004", "3"))
    before = rejudge(read_results(full)).coverage.to_json()["not_measured_where"]
    assert not [w for w in before if w.get("host") == "node004"]
    after = rejudge(read_results(cut)).coverage.to_json()["not_measured_where"]
    assert {(w["key"], w["host"], w["gpu"]) for w in after if "gpu" in w} == {
        ("burnin.min_cpu_matmul", "node004", "3"),
        ("burnin.min_cpu_memory_bandwidth", "node004", "3"),
    }


def test_a_results_file_that_records_its_profile_is_judged_under_that_profile(tmp_path):
    data = json.loads(REAL_RUN.read_text())
    model = load_profile("cpu-local").model
    burnin = model.burnin.model_copy(update={"min_cpu_matmul": 1e20})  # a policy no file holds
    data["profile"]["model"] = snapshot(model.model_copy(update={"burnin": burnin}))
    data["profile"]["path"] = "/nonexistent/cpu-local.yaml"
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    judged = rejudge(read_results(path))
    assert judged.note.startswith(
        "re-judged from the evidence under the profile recorded in the results file"
    )
    assert profile_of_snapshot(data["profile"]["model"], "x").burnin.min_cpu_matmul == 1e20


def test_every_shipped_profile_survives_its_snapshot():
    from pytest_gpucluster.profiles.loader import known_profiles

    for name in known_profiles():
        model = load_profile(name).model
        assert profile_of_snapshot(json.loads(json.dumps(snapshot(model))), name) == model, name


def test_the_real_h200_quick_run_fanned_with_noise_signs_fit_and_a_planted_slow_gpu_is_found(
    tmp_path, capsys
):
    """testbed/fanout.py puts noise on continuous readings only: the real H200 quick-tier results
    fanned to 8 such nodes (1 GPU each, as the real node) with the default ±2% noise keep every count,
    equality, boolean and zero-ceiling value exact (1 GPU, not 0.9956), so the report signs FIT; the
    same fleet with one GPU's matmul planted at 0.5 of the centre (below the profile's floor) signs
    NOT FIT naming that node with "reset GPU"."""
    real = json.loads(H200_RUN.read_text())
    healthy, _ = fan_out(real, 8, 1, plant=False)
    exact = [m for m in healthy["measurements"] if m.get("comparison") == "==" or m.get("unit") == "bool"]
    assert exact and all(float(m["value"]).is_integer() for m in exact)
    gpus = {m["value"] for m in healthy["measurements"] if m["metric"] == "inventory.gpus_per_node"}
    assert gpus == {1.0}
    matmul = [m["value"] for m in healthy["measurements"] if m["metric"] == "burnin.gpu_matmul"]
    assert len(set(matmul)) == 8 and max(matmul) / min(matmul) > 1.001  # continuous values still vary
    assert [m for m in healthy["measurements"] if m.get("verdict") == "fail"] == []
    path = tmp_path / "healthy" / "results.json"
    path.parent.mkdir()
    path.write_text(dumps(healthy))
    assert cli.main(["report", str(path)]) == 0
    capsys.readouterr()
    assert "**FIT:" in (path.parent / "report.md").read_text()

    planted, where = fan_out(real, 8, 1, slow_factor=0.5)
    assert (where.slow_node, where.slow_gpu, where.slow_metric, where.port_node) == (
        "node003",
        "0",
        "burnin.gpu_matmul",
        None,  # the quick tier records no per-port error counter: no port planted
    )
    path = tmp_path / "planted" / "results.json"
    path.parent.mkdir()
    path.write_text(dumps(planted))
    assert cli.main(["report", str(path)]) == 0
    report = (path.parent / "report.md").read_text()
    assert "**NOT FIT" in report and "1 of 8 node(s) fail: node003" in report
    row = next(line for line in report.splitlines() if line.startswith("| node003 |"))
    assert "burnin.gpu_matmul" in row and "reset GPU" in row
