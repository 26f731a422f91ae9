"""Part profiles (one per devices.yaml entry) carry hardware only, and every floor in them is the
rule of `profiles.part_rules` applied to the part's datasheet figures: recomputed here from the
table, so neither the files nor the table can drift alone."""

import pytest

from pytest_gpucluster.profiles.detect import shape_to_nodes
from pytest_gpucluster.profiles.devices import load_devices
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.profiles.part_rules import part_floors

DEVICES = {d.key: d for d in load_devices()}


def _value(model, key):
    if key == "collectives.checks[0].min_busbw":
        return model.collectives.checks[0].min_busbw
    if key.startswith("numerics.min_flops."):
        return model.numerics.min_flops.get(key.rpartition(".")[2])
    section, field = key.split(".")
    return getattr(getattr(model, section), field)


@pytest.mark.parametrize("key", sorted(DEVICES))
def test_a_part_profile_states_its_parts_figures_and_derived_floors(key):
    device, model = DEVICES[key], load_profile(key).model
    cluster = model.cluster
    assert cluster.gpu_model in device.names
    assert cluster.peak_flops == pytest.approx(device.peak_flops)
    assert cluster.memory_bandwidth == pytest.approx(device.memory_bandwidth)
    assert cluster.gpu_memory == pytest.approx(device.memory)
    nvlink = model.nvlink is not None
    switched = nvlink and model.nvlink.topology is not None
    if nvlink:
        assert cluster.nvlink_bandwidth == pytest.approx(device.nvlink_bandwidth)
        assert model.nvlink.links_per_gpu == device.nvlink_links
    floors = part_floors(device, nvlink=nvlink, switched=switched)
    for floor in floors:
        assert _value(model, floor.key) == pytest.approx(floor.value, rel=1e-3), (floor.key, floor.derivation)
    # nothing gated that the rules do not derive
    derived = {f.key for f in floors}
    burnin = {f"burnin.{k}" for k in ("min_matmul", "min_memory_bandwidth", "min_h2d_bandwidth")}
    assert {k for k in burnin if _value(model, k) is not None} == derived & burnin
    assert len(model.collectives.checks) == (1 if switched else 0)
    # a numerics floor for every dtype the part has a dense peak for, and none other
    assert {f"numerics.min_flops.{d}" for d in model.numerics.min_flops} == {
        k for k in derived if k.startswith("numerics.")
    }
    assert set(model.numerics.min_flops) == {dtype for dtype, _ in device.dense_flops}


@pytest.mark.parametrize("key", sorted(DEVICES))
def test_a_part_profile_describes_no_site(key):
    model = load_profile(key).model
    assert not model.nccl_env and not model.collectives.scope_env
    assert model.cluster.nics_per_node is None and model.cluster.nic_line_rate is None
    assert model.nccl is None and not model.sft.cases and model.scaling is None
    assert model.cluster.nodes == 1


def test_site_profiles_take_the_parts_floors_and_add_their_network():
    site, part = load_profile("h200-spectrumx").model, load_profile("h200-sxm").model
    assert site.extends == "h200-sxm"
    assert site.burnin.min_matmul == part.burnin.min_matmul
    assert site.cluster.peak_flops == part.cluster.peak_flops
    assert site.nccl_env["NCCL_SOCKET_IFNAME"] == "bond0" and site.cluster.nics_per_node == 8


def test_auto_shapes_the_part_to_the_probed_gpus_and_nodes():
    part = load_profile("h200-sxm")
    one, why = shape_to_nodes(part, [1])
    assert one.model.cluster.gpus_per_node == 1 and one.model.cluster.effective_ranks_per_node == 1
    assert "1 node(s) x 1 GPU(s) (the part profile says 1 x 8)" in why
    assert one.model.burnin.min_matmul == part.model.burnin.min_matmul  # H200 floors, one GPU
    # a node that lost a GPU does not shrink the shape: the preflight names it
    two, _ = shape_to_nodes(part, [8, 7])
    assert (two.model.cluster.nodes, two.model.cluster.gpus_per_node) == (2, 8)
    same, why = shape_to_nodes(part, [8])
    assert same is part and why == ""
