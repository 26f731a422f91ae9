"""``gpucluster fabric scan`` with the real infiniband-diags and opensm on fabrics simulated by
ibsim (FEASIBILITY §9): one simulator per generated topology, shared by the module's tests.

Must show (issue 37): a clean 8-node x 2-rail fabric scans clean; a 1X cable among 4X ones, a cable
missing against the golden topology, an HCA on the wrong rail's leaf, and a SymbolErrorCounter
that rises between two scans are each named by both ends with the action; an unchanged fabric
between two scans has no counter finding.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpucluster.cli import main
from pytest_gpucluster.testbed.ib_topology import TopologySpec, generate
from pytest_gpucluster.testbed.ibsim import IbSim, missing_tools

pytestmark = pytest.mark.skipif(
    bool(missing_tools()), reason=f"no simulated IB fabric: not installed: {', '.join(missing_tools())}"
)

CLEAN = TopologySpec(nodes=8, rails=2, speed=4)  # 4X QDR everywhere
FAULTY = TopologySpec(
    nodes=8,
    rails=2,
    speed=4,
    narrow=(("gpu-node-003 mlx5_1", 1),),  # trains at 1X on both ends
    slow=(("gpu-node-002 mlx5_0", 1),),  # runs at SDR among QDR
    missing=(("gpu-node-005 mlx5_0", 1),),  # the cable is pulled
    swap_rails=((6, 0, 1),),  # gpu-node-007's two HCAs plugged into each other's leaf ports
)


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("golden") / "golden.ibnetdiscover"
    path.write_text(generate(CLEAN).text())
    return path


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IbSim]:
    with IbSim(generate(CLEAN).text(), tmp_path_factory.mktemp("ibsim-clean")) as sim:
        yield sim


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IbSim]:
    with IbSim(generate(FAULTY).text(), tmp_path_factory.mktemp("ibsim-faulty")) as sim:
        yield sim


def scan(sim: IbSim, capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, list[str]]:
    code = main(["fabric", "scan", "--tool-prefix", shlex.join(sim.prefix), *map(str, args)])
    out = capsys.readouterr()
    return code, [line.strip() for line in out.out.splitlines()[1:]] + out.err.splitlines()


def test_clean_fabric_scans_clean(
    clean: IbSim, golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = scan(clean, capsys, "--rail-optimized", "--expect-topology", golden, "--out", tmp_path)
    assert (code, lines) == (0, [])
    doc = json.loads((tmp_path / "fabric.json").read_text())
    assert {(x["width"], x["speed"]) for x in doc["model"]["links"]} == {(4, "QDR")}
    assert doc["findings"] == [] and len(doc["model"]["links"]) == 8 * 2 + 4 * 2  # HCA cables + leaf-spine
    assert doc["model"]["sm"]["state"] == "SMINFO_MASTER"
    # the scan's own ibnetdiscover is a golden topology for the next one
    code, lines = scan(clean, capsys, "--expect-topology", tmp_path / "ibnetdiscover.txt")
    assert (code, lines) == (0, [])


def test_counters_between_two_scans(clean: IbSim, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert scan(clean, capsys, "--out", tmp_path / "before") == (0, [])
    code, lines = scan(
        clean, capsys, "--since", tmp_path / "before" / "fabric.json", "--out", tmp_path / "same"
    )
    assert (code, lines) == (0, [])  # unchanged fabric: no counter finding (the SM's traffic is not an error)
    clean.set_counter("leaf-r1-01", 3, "SymbolErrorCounter", 500)
    try:
        code, lines = scan(clean, capsys, "--since", tmp_path / "same" / "fabric.json")
    finally:
        clean.set_counter("leaf-r1-01", 3, "SymbolErrorCounter", 0)
    assert code == 1
    assert lines == [
        "leaf-r1-01 port 3 <-> gpu-node-003 mlx5_1 (rail 1): SymbolErrorCounter +500 (0 -> 500, allowed 0) "
        "-> replace cable"
    ]


def test_faults_named_by_both_ends(
    faulty: IbSim, golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = scan(faulty, capsys, "--rail-optimized")
    assert code == 1
    narrow = "leaf-r1-01 port 3 <-> gpu-node-003 mlx5_1 (rail 1): trained at 1X, expected 4X"
    assert [x for x in lines if x.startswith(narrow)] == [
        f"{narrow} (as 14 of 15 host cables) -> replace cable"
    ]
    assert "leaf-r1-02 port 3 <-> gpu-node-007 mlx5_0 (rail 0): a rail-0 HCA on a rail-1 leaf " in "\n".join(
        lines
    )
    assert any(x.startswith("leaf-r0-02 port 3 <-> gpu-node-007 mlx5_1 (rail 1): a rail-1 HCA on a rail-0 leaf")
               and x.endswith("-> re-cable gpu-node-007 mlx5_1 to a rail-1 leaf") for x in lines)  # fmt: skip
    assert any(x.startswith("gpu-node-005: 1 HCA(s) on the fabric (mlx5_1), most hosts: 2") for x in lines)
    slow = "leaf-r0-01 port 2 <-> gpu-node-002 mlx5_0 (rail 0): runs at SDR, expected QDR (as 14 of 15 host cables)"
    assert f"{slow} -> replace cable" in lines
    assert len(lines) == 5

    code, lines = scan(faulty, capsys, "--expect-topology", golden)
    assert code == 1
    assert (
        "leaf-r0-02 port 1 <-> gpu-node-005 mlx5_0 (rail 0): in the golden topology, not found "
        "(leaf-r0-02 port 1: Down/Polling; gpu-node-005 mlx5_0 (rail 0): not on the fabric) "
        "-> reseat or replace the cable"
    ) in lines
    assert (
        "gpu-node-007 mlx5_0 (rail 0) <-> leaf-r1-02 port 3: the golden topology has gpu-node-007 mlx5_0 (rail 0) "
        "cabled to leaf-r0-02 port 3 -> move the cable back to leaf-r0-02 port 3"
    ) in lines
    assert sum("move the cable back" in x for x in lines) == 2 and len(lines) == 5


def test_pulled_cable_while_running_is_named(
    faulty: IbSim, golden: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    faulty.unlink("leaf-r0-01", 1)
    try:
        faulty.sweep()
        code, lines = scan(faulty, capsys, "--expect-topology", golden)
    finally:
        faulty.relink("leaf-r0-01", 1)
        faulty.sweep()
    assert code == 1
    assert any(x.startswith("leaf-r0-01 port 1 <-> gpu-node-001 mlx5_0 (rail 0): in the golden topology, not found")
               for x in lines)  # fmt: skip


def test_could_not_scan_names_the_tool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fabric", "scan", "--tool-prefix", str(tmp_path / "no-such-wrapper")])
    assert code == 2
    assert "could not scan: " in capsys.readouterr().err


def test_cable_history_names_the_cable_that_keeps_failing(
    faulty: IbSim, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "history.sqlite"
    for name in ("monday", "tuesday"):
        assert scan(faulty, capsys, "--out", tmp_path / name)[0] == 1
    assert (
        main(
            [
                "history",
                "add-fabric",
                "--db",
                str(db),
                *(str(tmp_path / n / "fabric.json") for n in ("monday", "tuesday")),
            ]
        )
        == 0
    )
    assert (
        main(["history", "add-fabric", "--db", str(db), str(tmp_path / "monday" / "fabric.json")]) == 0
    )  # once only
    capsys.readouterr()
    assert main(["history", "cables", "--db", str(db), "--recurring", "2"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "cables failing in 2+ of the last 2 fabric scan(s): 2"  # the 1X cable and the SDR one
    assert out[1] == "gpu-node-002 mlx5_0 (rail 0) <-> leaf-r0-01 port 2: failed in 2 of the last 2 scans"
    assert out[4] == "gpu-node-003 mlx5_1 (rail 1) <-> leaf-r1-01 port 3: failed in 2 of the last 2 scans"
    assert all("runs at SDR" in line for line in out[2:4]) and all(
        "trained at 1X" in line for line in out[5:]
    )
    assert len(out) == 7


def test_acceptance_before_after_scan_checks(clean: IbSim, monkeypatch: pytest.MonkeyPatch) -> None:
    """What acceptance/test_fabric.py records around a run when the controller reaches the fabric."""
    from pytest_gpucluster.fabric_scan import TOOL_PREFIX_ENV, suite_checks, suite_reading
    from pytest_gpucluster.profiles.loader import load_profile

    hw = load_profile("cpu-local").model
    monkeypatch.setenv(TOOL_PREFIX_ENV, shlex.join(clean.prefix))
    said: list[str] = []
    before = suite_reading(said.append)
    assert before is not None and said == []
    assert [(c.metric, c.value, c.failed) for c in suite_checks(before, hw)] == [
        ("fabric.ib.findings", 0, False)
    ]
    clean.set_counter("leaf-r0-02", 2, "LinkErrorRecoveryCounter", 7)
    try:
        checks = suite_checks(before, hw)
    finally:
        clean.set_counter("leaf-r0-02", 2, "LinkErrorRecoveryCounter", 0)
    assert [(c.metric, c.value, c.failed) for c in checks] == [
        ("fabric.ib.findings", 1, False), ("fabric.ib.counter", 1, True)]  # fmt: skip
    assert checks[1].labels == {"pair": "leaf-r0-02 port 2 <-> gpu-node-006 mlx5_0 (rail 0)"}
    assert checks[1].hint == "LinkErrorRecoveryCounter +7 (0 -> 7, allowed 0) -> replace cable"
    monkeypatch.setenv(TOOL_PREFIX_ENV, "/nonexistent/wrapper")
    assert suite_reading(said.append) is None and said[0].startswith("InfiniBand fabric scan skipped: ")


def test_fat_tree_leaf_short_of_an_uplink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A plain fat tree (a node's HCAs all on its own leaf), one leaf-to-spine cable left out: without a
    golden topology the leaf is named with its Down port."""
    spec = TopologySpec(nodes=12, rails=2, rail_optimized=False, speed=4, missing=(("leaf-02", 10),))
    with IbSim(generate(spec).text(), tmp_path / "ibsim") as sim:
        code, lines = scan(sim, capsys)
    assert code == 1
    assert lines == [
        "leaf-02: 1 uplinks, 2 of 3 leaves have 2; its ports Down: 10 -> find the uplink cable that is missing or "
        "down and reseat or replace it"
    ]
