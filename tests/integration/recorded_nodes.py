"""Give network-namespace "nodes" the GPUs and fabric ports of real machines, from recordings.

`RecordedNodes(root)` prepares, under ``root``:

- ``bin/nvidia-smi``: a stand-in that prints ``<root>/<hostname>/nvidia-smi.txt`` (a recorded
  real output, tests/data/nvidia_smi) and exits 0; on a host with no recording it prints what the
  real tool prints without a driver and exits 9. Inside a namespace node the hostname is the
  namespace's (the ``netns`` remote-exec preset sets it), so one PATH serves every node: put
  ``bin`` on the controller's PATH and the launch forwards it;
- ``<root>/sysfs/<hostname>/class/infiniband/...``: a recorded sysfs tree per node, for
  ``GPUCLUSTER_SYSFS_ROOT=<root>/sysfs/{host}``.

The probe's real code path runs: it finds a program called nvidia-smi on PATH, runs it, and the
parent parses what it printed.
"""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

DATA = Path(__file__).parents[1] / "data"
SMI = DATA / "nvidia_smi"
H100_TABLE = SMI / "smi_h100x8_565.57.01_nvsim.txt"
H100_SYSFS = DATA / "infiniband" / "sysfs_h100_9dev_attrs_gpud"
H200_TABLE = SMI / "smi_h200x8_550.163.01_mir_hw2.txt"
H200_1GPU_TABLE = SMI / "smi_h200_1gpu_passthrough_550.90.12_smisim.txt"
ETH0_SYSFS = DATA / "netdev" / "sysfs_net_eth0_this_vm"
"""A node whose only interface is ``eth0`` (this VM's, recorded) and which has no RDMA device."""
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def without_gpu(text: str, index: int) -> str:
    """A recorded table with one GPU's block (three lines and the separator after them) removed."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"|   {index}  NVIDIA"))
    return "".join(lines[:start] + lines[start + 4 :])


class RecordedNodes:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        script = self.bin / "nvidia-smi"
        script.write_text(
            "#!/bin/sh\n"
            f'recording="{root}/$(hostname)/nvidia-smi.txt"\n'
            'if [ -f "$recording" ]; then cat "$recording"; exit 0; fi\n'
            f"printf '%s' '{NO_DRIVER}'\n"
            "exit 9\n"
        )
        script.chmod(script.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)

    @property
    def sysfs_template(self) -> str:
        return str(self.root / "sysfs" / "{host}")

    def add(self, host: str, table: str, sysfs: Path = H100_SYSFS) -> Path:
        """Node ``host`` prints ``table`` and has the ports of ``sysfs``; returns its sysfs copy."""
        (self.root / host).mkdir(parents=True, exist_ok=True)
        (self.root / host / "nvidia-smi.txt").write_text(table)
        tree = self.root / "sysfs" / host
        shutil.copytree(sysfs, tree)
        return tree

    def port(self, host: str, device: str, name: str, text: str) -> None:
        """Set one attribute of port 1 of ``device`` on ``host`` (``state``, ``rate``...)."""
        (self.root / "sysfs" / host / "class" / "infiniband" / device / "ports" / "1" / name).write_text(text)
