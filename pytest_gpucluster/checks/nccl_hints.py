"""The sentences NCCL findings are made of: which log line each expectation looks for, and what to
look at next when it fails. Data only, kept apart from the logic that picks them (``checks/nccl.py``)."""

from __future__ import annotations

__all__ = ["LOOKED_FOR", "NEXT"]

LOOKED_FOR: dict[str, str] = {
    "min_version": "'NCCL version <x.y.z>'",
    "network": "'Using network <name>' (or a channel line '... via NET/<name>/...')",
    "net_plugin": (
        "'NET/Plugin: Loaded net plugin <name>', 'Successfully loaded external plugin <lib>' "
        "or 'NET/OFI Initializing aws-ofi-nccl <version>'"
    ),
    "net_plugin.min_version": "'NET/OFI Initializing aws-ofi-nccl <version>'",
    "provider": "'NET/OFI Selected provider is <name>'",
    "gdr": (
        "a channel line '... via NET/<name>/<dev>/GDRDMA', 'GPU Direct RDMA Enabled|Disabled' or 'GDR 0|1'"
    ),
    "nvls": "'NVLS multicast support is (not) available' or '<n> nvls channels'",
}

NEXT: dict[str, str] = {
    "min_version": "upgrade NCCL (or the PyTorch wheel that bundles it) on every node",
    "network": (
        "check that the RDMA stack (libibverbs, or the net plugin and libfabric on EFA) is installed on "
        "every node and that NCCL_NET, NCCL_IB_DISABLE or NCCL_IB_HCA do not steer NCCL elsewhere"
    ),
    "net_plugin": (
        "check NCCL_NET_PLUGIN and that the plugin's libnccl-net*.so is on LD_LIBRARY_PATH on every node"
    ),
    "net_plugin.none": (
        "the profile expects NCCL's built-in transport: unset NCCL_NET_PLUGIN or take libnccl-net*.so "
        "off LD_LIBRARY_PATH"
    ),
    "net_plugin.min_version": "install a newer net plugin on every node",
    "provider": "check FI_PROVIDER and the fabric with 'fi_info -p <provider>'",
    "gdr": (
        "check the nvidia-peermem module (or dma-buf support), NCCL_NET_GDR_LEVEL and, on EFA, "
        "FI_EFA_USE_DEVICE_RDMA=1"
    ),
    "nvls": "NVLS needs NVSwitch systems with the fabric manager running, NCCL >= 2.17 and NCCL_NVLS_ENABLE",
    "errors": (
        "read the quoted lines: a failed verbs call or completion error points at the HCA, cable or switch "
        "(ibstat, ibv_devinfo, the switch port counters); a closed connection or socket failure at the peer "
        "that failed first; 'network ... not found' at NCCL_NET, NCCL_NET_PLUGIN and the plugin library path"
    ),
    "agreement": (
        "every node must run the same NCCL, plugin and network: compare the odd node's image, "
        "LD_LIBRARY_PATH and NCCL_* environment with the others"
    ),
}
