"""acceptance/test_fabric.py's fabric-wide scan, run whole (pytester) against a fabric simulated by
ibsim: the before/after readings also scan every cable and switch port, and the findings of the
scan after the run become ``fabric.ib.*`` checks that name each cable by both ends."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from acceptance_runs import acceptance_run, measurements

from pytest_gpucluster.fabric_scan import TOOL_PREFIX_ENV
from pytest_gpucluster.testbed.ib_topology import TopologySpec, generate
from pytest_gpucluster.testbed.ibsim import IbSim, missing_tools

REPO = Path(__file__).resolve().parents[2]
ACCEPTANCE = REPO / "acceptance"

pytestmark = pytest.mark.skipif(
    bool(missing_tools()), reason=f"no simulated IB fabric: not installed: {', '.join(missing_tools())}"
)


@pytest.fixture
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IbSim]:
    spec = TopologySpec(nodes=4, rails=2, speed=4, narrow=(("gpu-node-002 mlx5_1", 1),))
    with IbSim(generate(spec).text(), tmp_path_factory.mktemp("ibsim")) as sim:
        yield sim


def test_the_run_scans_the_fabric_and_names_a_narrow_cable(pytester, tmp_path, monkeypatch, fabric):
    monkeypatch.delenv("GPUCLUSTER_SOAK", raising=False)
    monkeypatch.setenv(TOOL_PREFIX_ENV, shlex.join(fabric.prefix))
    files = {"test_fabric": ACCEPTANCE / "test_fabric.py", "test_burnin": ACCEPTANCE / "test_burnin.py"}
    run = acceptance_run(
        pytester, monkeypatch, tmp_path, files, "--hw=cpu-local", conftest=ACCEPTANCE / "conftest.py"
    )
    result = run("test_fabric.py", "-k", "fabric_before or fabric_after")
    result.assert_outcomes(passed=1, failed=1)
    rows = {m["metric"]: m for m in measurements(tmp_path) if m["metric"].startswith("fabric.ib.")}
    assert rows["fabric.ib.findings"]["value"] == 1
    narrow = rows["fabric.ib.link-width"]
    assert narrow["labels"] == {"pair": "leaf-r1-01 port 2 <-> gpu-node-002 mlx5_1 (rail 1)"}
    assert narrow["verdict"] == "fail"
    result.stdout.fnmatch_lines(["*fabric.ib.link-width*leaf-r1-01 port 2 <-> gpu-node-002 mlx5_1 (rail 1)*"])
