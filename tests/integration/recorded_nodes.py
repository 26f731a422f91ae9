"""Give network-namespace "nodes" the GPUs and fabric ports of real machines, from recordings.

`RecordedNodes(root)` prepares, under ``root``:

- ``bin/nvidia-smi``: a stand-in that prints ``<root>/<hostname>/nvidia-smi.txt`` (a recorded
  real output, tests/data/nvidia_smi) and exits 0; on a host with no recording it prints what the
  real tool prints without a driver and exits 9. Inside a namespace node the hostname is the
  namespace's (the ``netns`` remote-exec preset sets it), so one PATH serves every node: put
  ``bin`` on the controller's PATH and the launch forwards it;
- ``<root>/sysfs/<hostname>/class/infiniband/...``: a recorded sysfs tree per node, for
  ``GPUCLUSTER_SYSFS_ROOT=<root>/sysfs/{host}``;
- the node's readiness (`readiness_standin`): ``nvidia-smi -q``, ``lspci``, ``systemctl``,
  ``journalctl``/``dmesg`` stand-ins on the same PATH, the PCIe devices, modules and IOMMU groups
  in the sysfs tree, a procfs tree for ``GPUCLUSTER_PROC_ROOT=<root>/proc/{host}`` and Fabric
  Manager's log for ``GPUCLUSTER_FM_LOG``; healthy, or with one `readiness_standin.Fault`.
  `RecordedNodes.env` is every variable that points the probe at them.

The probe's real code path runs: it finds a program called nvidia-smi on PATH, runs it, and the
parent parses what it printed.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from readiness_standin import Fault, install_programs, write_node

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
            f'dir="{root}/$(hostname)"\n'
            'if [ "$1" = "-q" ] && [ -f "$dir/nvidia-smi-q.txt" ]; then cat "$dir/nvidia-smi-q.txt"; exit 0; fi\n'
            'if [ -f "$dir/nvidia-smi.txt" ]; then cat "$dir/nvidia-smi.txt"; exit 0; fi\n'
            f"printf '%s' '{NO_DRIVER}'\n"
            "exit 9\n"
        )
        script.chmod(script.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)
        install_programs(self.bin, root)

    @property
    def sysfs_template(self) -> str:
        return str(self.root / "sysfs" / "{host}")

    @property
    def proc_template(self) -> str:
        return str(self.root / "proc" / "{host}")

    def env(self, path: str | None = None) -> dict[str, str]:
        """The variables that make the probe read these recordings: PATH (the stand-in programs
        first), the sysfs and procfs roots and Fabric Manager's log."""
        return {
            "PATH": f"{self.bin}{os.pathsep}{path if path is not None else os.environ['PATH']}",
            "GPUCLUSTER_SYSFS_ROOT": self.sysfs_template,
            "GPUCLUSTER_PROC_ROOT": self.proc_template,
            "GPUCLUSTER_FM_LOG": str(self.root / "{host}" / "fabricmanager.log"),
        }

    def add(self, host: str, table: str, sysfs: Path = H100_SYSFS, fault: Fault | None = None) -> Path:
        """Node ``host`` prints ``table``, has the ports of ``sysfs`` and a recorded HGX H100's
        readiness (with ``fault``, one thing broken); returns its sysfs copy."""
        (self.root / host).mkdir(parents=True, exist_ok=True)
        (self.root / host / "nvidia-smi.txt").write_text(table)
        tree = self.root / "sysfs" / host
        shutil.copytree(sysfs, tree)
        write_node(self.root / host, tree, self.root / "proc" / host, table, fault)
        return tree

    def port(self, host: str, device: str, name: str, text: str) -> None:
        """Set one attribute of port 1 of ``device`` on ``host`` (``state``, ``rate``...)."""
        (self.root / "sysfs" / host / "class" / "infiniband" / device / "ports" / "1" / name).write_text(text)
