"""The preflight on real recorded node readings: NCCL's list syntax (prefix, ``=``, ``^``, ``:port``)
against the interfaces and RDMA ports a node has, ranks against GPUs, the GPU count and part; every
finding on every node, each naming the node, the variable and what the node has."""

import dataclasses
import shutil
import sys
from pathlib import Path

import pytest

from pytest_gpucluster.cluster.nccl_names import unknown_nccl_names
from pytest_gpucluster.cluster.node_facts import ClusterFacts, NetLink, node_facts
from pytest_gpucluster.cluster.preflight import preflight, selects
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.profiles.nccl_env import nic_selection
from pytest_gpucluster.workloads import fabric_probe

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from recorded_nodes import ETH0_SYSFS, H100_SYSFS, H100_TABLE, H200_1GPU_TABLE, without_gpu

pytestmark = pytest.mark.quick


def _node(host, table, sysfs):
    record = {
        "host": host,
        "gpu": {"source": "nvidia-smi", "text": table, "returncode": 0},
        "infiniband": fabric_probe.read_ib_ports(sysfs),
        "links": fabric_probe.read_links(sysfs, shaping=False),
        "cuda_available": True,
        "nccl_available": True,
    }
    return node_facts(record)


def _run(profile, nodes, env, ranks=8, origin="profile p: nccl_env"):
    facts = ClusterFacts(tuple(nodes), "recorded")
    return preflight(
        facts, load_profile(profile).model, env=env, env_origin=dict.fromkeys(env, origin),
        ranks_per_node=ranks, ranks_origin="profile p: cluster.gpus_per_node",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "device", "port", "kept"),
    [
        ("mlx5_1", "mlx5_1", 1, True),
        ("mlx5_1", "mlx5_10", 1, True),  # a prefix: the classic surprise
        ("=mlx5_1", "mlx5_10", 1, False),
        ("=mlx5_0,mlx5_1", "mlx5_1", 1, True),
        ("^mlx5_bond", "mlx5_bond_0", 1, False),
        ("^mlx5_bond", "mlx5_0", 1, True),
        ("^=mlx5_0", "mlx5_0", 1, False),
        ("^=mlx5_0", "mlx5_01", 1, True),
        ("mlx5_0:1", "mlx5_0", 1, True),
        ("mlx5_0:2", "mlx5_0", 1, False),
        ("eth", "eth0", None, True),
        ("bond0", "eth0", None, False),
    ],
)
def test_nccl_list_syntax(value, device, port, kept):
    assert selects(nic_selection({"X": value}, "X"), device, port) is kept


def test_every_finding_on_every_node_is_listed(tmp_path):
    table = H100_TABLE.read_text()
    nodes = [
        _node("gpu-01", table, H100_SYSFS),  # healthy: 8 x H100, mlx5_0..9 but 2/3, a bond
        _node("gpu-02", without_gpu(table, 7), H100_SYSFS),  # lost a GPU
        _node("gpu-03", table, ETH0_SYSFS),  # eth0 only, no RDMA device
    ]
    env = {"NCCL_SOCKET_IFNAME": "bond0", "NCCL_IB_HCA": "=mlx5_0,mlx5_2"}
    found = [f.message for f in _run("dgx-h100-ib", nodes, env) if f.severity == "error"]
    # gpu-01 and gpu-02 have no network interfaces in the recorded tree: not judged (no reading)
    assert found == [
        "gpu-01: NCCL_IB_HCA==mlx5_0,mlx5_2 names mlx5_2, which this node does not have (has mlx5_0, mlx5_1, "
        "mlx5_4, mlx5_5, mlx5_6, mlx5_7, mlx5_8, mlx5_9, mlx5_bond_0) (profile p: nccl_env)",
        "gpu-02: NCCL_IB_HCA==mlx5_0,mlx5_2 names mlx5_2, which this node does not have (has mlx5_0, mlx5_1, "
        "mlx5_4, mlx5_5, mlx5_6, mlx5_7, mlx5_8, mlx5_9, mlx5_bond_0) (profile p: nccl_env)",
        "gpu-02: 8 ranks per node asked (profile p: cluster.gpus_per_node), 7 GPUs present: ranks would share "
        "a GPU and NCCL refuses that ('Duplicate GPU detected')",
        "gpu-02: 7 GPUs, profile dgx-h100-ib wants 8 (cluster.gpus_per_node)",
        "gpu-03: NCCL_SOCKET_IFNAME=bond0 matches no interface (has eth0, lo); NCCL's bootstrap fails at init on "
        "every job (profile p: nccl_env)",
        "gpu-03: NCCL_IB_HCA==mlx5_0,mlx5_2 names mlx5_0, which this node does not have (has no RDMA device "
        "under /sys/class/infiniband) (profile p: nccl_env)",
        "gpu-03: NCCL_IB_HCA==mlx5_0,mlx5_2 names mlx5_2, which this node does not have (has no RDMA device "
        "under /sys/class/infiniband) (profile p: nccl_env)",
    ]


def _with_states(tmp_path, **states):
    """The recorded H100 tree with some ports' state changed (``mlx5_0="1: DOWN"``)."""
    root = tmp_path / "sys"
    shutil.copytree(H100_SYSFS, root)
    for device, state in states.items():
        (root / "class" / "infiniband" / device / "ports" / "1" / "state").write_text(state + "\n")
    return root


def test_hcas_outside_the_list_are_not_counted_and_a_partly_down_selection_is_a_warning(tmp_path):
    node = _node("gpu-01", H100_TABLE.read_text(), H100_SYSFS)
    # the other 7 active HCAs (storage, a bond) are outside NCCL_IB_HCA: not NCCL's, not a finding
    assert _run("dgx-h100-ib", [node], {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}) == []
    assert _run("dgx-h100-ib", [node], {"NCCL_IB_HCA": "mlx5"}) == []  # every device, by prefix
    half = _node("gpu-01", H100_TABLE.read_text(), _with_states(tmp_path, mlx5_1="1: DOWN"))
    found = _run("dgx-h100-ib", [half], {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"})
    assert [(f.severity, f.message) for f in found] == [
        ("warning", "gpu-01: NCCL_IB_HCA==mlx5_0,mlx5_1 selects 2 RDMA ports and 1 are active (mlx5_1:1 not): "
         "NCCL runs on part of the fabric (profile p: nccl_env)"),
    ]  # fmt: skip


def test_every_selected_hca_port_down_is_an_error_nccl_would_use_sockets(tmp_path):
    down = _node("gpu-01", H100_TABLE.read_text(), _with_states(tmp_path, mlx5_0="1: DOWN", mlx5_1="1: DOWN"))
    [found] = _run("dgx-h100-ib", [down], {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"})
    assert found.severity == "error" and "all of them DOWN (mlx5_0:1, mlx5_1:1)" in found.message
    assert "falls back to TCP sockets" in found.message


def _links(node, **links):
    return dataclasses.replace(node, links=tuple(NetLink(name, **kw) for name, kw in links.items()))


def test_interfaces_are_judged_by_their_address_and_lo_is_refused_on_several_nodes():
    base = _node("vm", H200_1GPU_TABLE.read_text(), ETH0_SYSFS)

    def ifname(nodes, value):
        found = _run("h200-sxm", nodes, {"NCCL_SOCKET_IFNAME": value}, ranks=1)
        return [f for f in found if f.requirement == "NCCL_SOCKET_IFNAME"]

    bare = _links(base, eth0={"operstate": "up", "has_address": False})
    [found] = ifname([bare], "eth0")
    assert found.severity == "error" and "eth0 has no IP address" in found.message
    addressed = _links(base, eth0={"operstate": "up", "has_address": True})
    assert ifname([addressed], "eth0") == []
    # lo is fine on one node, refused on two
    assert ifname([addressed], "lo") == []
    found = ifname([addressed, dataclasses.replace(addressed, host="vm2")], "lo")
    assert [f.host for f in found] == ["vm", "vm2"]
    assert "only lo, the loopback, on a multi-node run" in found[0].message


def test_the_wrong_part_and_an_excluding_list_that_leaves_nothing():
    node = _node("vm", H200_1GPU_TABLE.read_text(), ETH0_SYSFS)
    found = _run("dgx-h100-ib", [node], {"NCCL_SOCKET_IFNAME": "^eth,lo"}, ranks=1)
    assert [f.requirement for f in found] == ["NCCL_SOCKET_IFNAME", "GPU count", "GPU model"]
    assert (
        found[2].message
        == "vm: GPU NVIDIA H200 is not the part profile dgx-h100-ib names ('H100 80GB HBM3', cluster.gpu_model)"
    )
    assert _run("h200-sxm", [node], {"NCCL_SOCKET_IFNAME": "=eth0"}, ranks=1)[0].requirement == "GPU count"


def test_a_cpu_profile_and_a_node_listing_no_gpu_are_not_judged_on_gpus():
    node = _node("vm", "", ETH0_SYSFS)
    assert _run("h200-sxm", [node], {}) == []  # the capability marks say why its GPU tests skip
    assert _run("cpu-local", [node], {"NCCL_SOCKET_IFNAME": "bond0"}) == []  # gloo reads no NCCL_*


def test_the_images_nccl_version_is_information_naming_both_releases():
    node = _node("vm", H200_1GPU_TABLE.read_text(), ETH0_SYSFS)
    node = dataclasses.replace(node, nccl="2.28.9", env={"NCCL_VERSION": "2.28.3"})
    [info] = _run("h200-sxm", [node], {}, ranks=1)[1:]
    assert info.severity == "info" and info.message == (
        "vm: torch loaded NCCL 2.28.9; the environment's NCCL_VERSION=2.28.3 (set by the container image, not "
        "read by NCCL) names a different release: the image's libnccl is not the one in use"
    )
    same = dataclasses.replace(node, env={"NCCL_VERSION": "2.28.9-1+cuda13.0"})
    assert "names the same release" in _run("h200-sxm", [same], {}, ranks=1)[-1].message
    assert unknown_nccl_names({"NCCL_VERSION": "2.28.3", "NCCL_IB_HCAS": "x"})[0].name == "NCCL_IB_HCAS"


def test_a_gpu_node_without_nvml_is_a_preflight_error_naming_the_install_command():
    """The probe's record of a real node whose GPUs only nvidia-smi could list (no pynvml there)."""
    from pytest_gpucluster.cluster.node_facts import ClusterFacts, GpuFact, NodeFacts
    from pytest_gpucluster.cluster.preflight import preflight

    gpus = tuple(
        GpuFact(i, "NVIDIA H100 80GB HBM3", None, 81559 * 2**20, f"00000000:{0x18 + i:02X}:00.0")
        for i in range(8)
    )
    why = "pynvml is not importable (No module named 'pynvml'); pip install nvidia-ml-py"
    node = NodeFacts(host="gpu-01", gpus=gpus, gpu_source="nvidia-smi", processes_problem=why, cuda_available=True,
                     torch_cuda="12.8", nccl_available=True)  # fmt: skip
    model = load_profile("h100-sxm").model
    found = preflight(
        ClusterFacts((node,), "test"), model, env={}, env_origin={}, ranks_per_node=8, ranks_origin="x"
    )
    [nvml] = [f for f in found if f.requirement == "NVML"]
    assert nvml.severity == "error" and "pip install nvidia-ml-py" in nvml.message and nvml.host == "gpu-01"
    cpu = load_profile("cpu-local").model  # a CPU profile asks nothing of NVML
    assert not [f for f in preflight(ClusterFacts((node,), "t"), cpu, env={}, env_origin={}, ranks_per_node=1,
                                     ranks_origin="x") if f.requirement == "NVML"]  # fmt: skip
