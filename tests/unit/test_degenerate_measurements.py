"""Degenerate measurements: a collective check whose scope is one rank is refused by ``profiles
check`` (and skipped by the run as not applicable); a busbw or memory bandwidth above the physical
ceiling of its path is a broken measurement that fails, naming the ceiling."""

import pytest

from pytest_gpucluster.checks.ceilings import broken_above, collective_ceiling, memory_ceiling
from pytest_gpucluster.checks.collectives import scope_nodes
from pytest_gpucluster.cli import main
from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.results.model import Check, ThresholdRef

ONE_GPU = """\
name: one-h200
description: a 1-GPU H200 VM
extends: h200-sxm
cluster:
  gpus_per_node: 1
collectives:
  checks:
    - {collective: all_reduce, scope: intra-node, size: 1GiB, min_busbw: 100GB/s, source: "a guess"}
"""


def test_profiles_check_refuses_a_one_rank_min_busbw(tmp_path, capsys):
    path = tmp_path / "one-h200.yaml"
    path.write_text(ONE_GPU)
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    assert (
        "key 'collectives.checks[0].min_busbw': all_reduce at scope intra-node runs on 1 rank (1 node x 1 rank "
        "per node, cluster.gpus_per_node): a collective on one rank measures nothing"
    ) in str(exc.value)
    assert main(["profiles", "check", "--strict", str(path)]) == 2
    assert "runs on 1 rank" in capsys.readouterr().err
    # two GPUs: a real measurement, accepted
    path.write_text(ONE_GPU.replace("gpus_per_node: 1", "gpus_per_node: 2"))
    assert load_profile(str(path)).model.cluster.gpus_per_node == 2


def test_the_run_skips_a_one_rank_scope_saying_why():
    nodes, why = scope_nodes("intra-node", 1, ranks_per_node=1)
    assert nodes == 0 and why.startswith(
        "not applicable: the intra-node scope has 1 rank here (1 node x 1 rank"
    )
    assert scope_nodes("full", 2, ranks_per_node=1) == (2, None)
    assert scope_nodes("intra-node", 1, ranks_per_node=2) == (1, None)


def _busbw(collective, value, threshold=None):
    ref = ThresholdRef("h200-sxm", ("collectives", "checks", 0, "min_busbw")) if threshold else None
    return Check(f"collectives.{collective}.busbw", value, "B/s", threshold, ">=", ref, "intra-node")


def test_a_busbw_above_the_links_is_a_broken_measurement_naming_the_ceiling():
    h200 = load_profile("h200-sxm").model
    # the real H200's 1-rank in-place broadcast: 69,000 GB/s "measured" at launch cost
    ceiling = collective_ceiling(h200, "broadcast", "intra-node")
    [broken] = broken_above([_busbw("broadcast", 69_000e9)], ceiling, "collectives.broadcast.busbw*")
    assert broken.problem == "broken measurement" and broken.verdict == "fail"
    assert broken.hint.startswith(
        "Broken measurement: 69,000.0 GB/s is above the physical ceiling of its path, 450.0 GB/s"
    )
    assert "NVLink per direction, cluster.nvlink_bandwidth" in broken.hint
    # a healthy NVLS all_reduce (Azure's 431 GB/s floor on H200, measured ~480) stays a measurement
    ok = _busbw("all_reduce", 480e9, threshold=202.5e9)
    assert broken_above([ok], collective_ceiling(h200, "all_reduce", "intra-node"), "collectives.*") == [ok]


def test_a_memory_copy_above_the_datasheet_is_broken_and_the_real_h200_figure_is_not():
    h200 = load_profile("h200-sxm").model
    ceiling = memory_ceiling(h200)
    real = Check("burnin.gpu_memory_bandwidth", 4253e9, "B/s", 3360e9)  # the real H200 run, read + written
    fake = Check("burnin.gpu_memory_bandwidth", 40e12, "B/s", 3360e9)
    out = broken_above([real, fake], ceiling, "burnin.gpu_memory_bandwidth")
    assert out[0] is real and out[1].problem == "broken measurement"
    assert "the device memory bandwidth, 4,800 GB/s (cluster.memory_bandwidth)" in out[1].hint
    assert memory_ceiling(load_profile("cpu-local").model) is None
