"""A pytest plugin (``-p cuda_torch_standin``) for a pytest run whose nodes are recorded machines:
the node probe's view of torch says torch can use the GPUs that the recorded ``nvidia-smi`` lists.

There is no CUDA build of torch on the machines the tests run on, so a node stand-in
(`recorded_nodes`) lists real recorded GPUs that this torch cannot use, and every GPU test skips for
the missing ``cuda`` capability. With this plugin the probe reports what a CUDA torch would: the
GPUs usable, its NCCL backend present (``GPUCLUSTER_STANDIN_NCCL``, default 2.28.9, the NCCL of the
real H200 run in shared/REFERENCE-FIGURES.md; as many GPUs as ``CUDA_VISIBLE_DEVICES`` lets
it see: `cuda_torch_standin_view`), and the session's view of this machine
(`profiles.detect.detect_machine`) lists the recorded GPUs as usable too. Only the pytest process
is patched, so use it with ``--gpucluster-dry-run`` or with tests that launch nothing: a launched
rank would still find no GPU.
"""

from __future__ import annotations

import dataclasses

from cuda_torch_standin_view import install

from pytest_gpucluster.cluster.probe import probe_here, probe_options
from pytest_gpucluster.profiles.detect import MachineInfo, detect_machine
from pytest_gpucluster.session import start

install()


def _cuda_machine() -> MachineInfo:
    machine = detect_machine()
    names = tuple(name for node in probe_here(probe_options(())).nodes for name in node.gpu_names)
    caps = machine.capabilities | {"cuda", "nccl"} if names else machine.capabilities
    return dataclasses.replace(machine, cuda_available=bool(names), gpu_names=names, capabilities=caps)


start.detect_machine = _cuda_machine
