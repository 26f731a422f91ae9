"""The sign-off report on a fabric scan's findings, as the acceptance run records them (recorded
ibsim outputs, tests/data/infiniband; no simulator needed)."""

from __future__ import annotations

from pathlib import Path

from pytest_gpucluster.parsers.ib_fabric import FabricModel, build_fabric

DATA = Path(__file__).resolve().parents[1] / "data" / "infiniband"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_report_lists_fabric_findings_by_link(tmp_path: Path) -> None:
    """The recorded ibsim scan's findings as the acceptance run records them: the sign-off report's
    findings table names each cable by both ends with the ladder's cable action."""
    import json

    from pytest_gpucluster.checks.ib_fabric import findings_checks
    from pytest_gpucluster.cli import main
    from pytest_gpucluster.fabric_scan import ScanSettings, judge
    from pytest_gpucluster.results.model import Measurement

    after = build_fabric(read("ibsim_8x2_faults_ibnetdiscover.txt"), read("ibsim_8x2_faults_iblinkinfo_line.txt"),
                         read("ibsim_8x2_faults_ibqueryerrors.txt"), read("ibsim_sminfo_master.txt"))  # fmt: skip
    before = FabricModel(after.nodes, after.links, after.port_states, {}, after.sm)
    checks = findings_checks(
        judge(after, ScanSettings(rails=2, rail_optimized=True), since=before), "cpu-local"
    )
    run = json.loads((DATA.parents[0] / "results" / "cpu_local_run.json").read_text())
    test_id = "acceptance/test_fabric.py::test_fabric_after"
    run["measurements"] = [
        Measurement.of(c, test_id=test_id, time=0.0).to_json() for c in checks
    ]  # these only: no charts
    (tmp_path / "results.json").write_text(json.dumps(run))
    assert main(["report", str(tmp_path / "results.json"), "--out", str(tmp_path)]) == 0
    rows = [line for line in (tmp_path / "report.md").read_text().splitlines() if line.startswith("| link ")]
    narrow = next(r for r in rows if "fabric.ib.link-width" in r)
    assert narrow.startswith("| link leaf-r1-01 port 3 <-> gpu-node-003 mlx5_1 (rail 1) |")
    assert "| reseat/replace cable or NIC |" in narrow and "trained at 1X, expected 4X" in narrow
    assert any("SymbolErrorCounter +500" in r and "fabric.max_error_increase" in r for r in rows)
    assert not any("gpu-node-005:" in r for r in rows)  # a host short of HCAs is a host, not a link
