"""A node's readiness sources, recorded: what `workloads.readiness_probe` reads on a real HGX H100,
laid out under a stand-in node's sysfs and procfs roots and behind stand-in programs.

Built from real recordings (tests/data/readiness/README.md credits each):

- ``nvidia-smi -q``: the GPU block of a real 8 x H100 node (gpud, driver 535.161.08; Fabric State
  Completed, persistence on, no row remap pending), once per GPU of the node's recorded table, at
  that GPU's bus id and name;
- ``lspci -vvv``: a real HGX H100 node (gpud: 8 H100, 4 NVSwitches, ConnectX-7 NICs behind
  Broadcom PEX890xx switches; ACS redirection only on the NVSwitch side, off the GPU<->NIC path);
- sysfs: ``bus/pci/devices/<bdf>`` for that node's GPUs, NVSwitches and Mellanox NICs with the
  link speed and width its lspci prints (LnkSta/LnkCap) and zero AER counts in the kernel's
  ``aer_dev_*`` format; ``module/nvidia{,_peermem}``; ``kernel/iommu_groups/*/type`` identity;
- procfs: ``self/limits`` (this machine's, memlock unlimited), ``driver/nvidia/version``,
  ``cmdline`` with ``iommu=pt``, two sleeping processes;
- ``systemctl is-active nvidia-fabricmanager``: ``active``; Fabric Manager's log: a real one (gpud).

A `Fault` changes one thing, as it happens on a real node: Fabric Manager down (``systemctl``
says ``inactive`` and every GPU's fabric state is ``In Progress``/``N/A``, as public reports show
it), ``nvidia_peermem`` not loaded, a pending row remap on one GPU (the A10 recording's
``Uncorrectable Error : 4``, ``Pending : Yes``), ACS redirection enabled on the PCIe switch port
above a GPU (the ACSCtl line this same node prints on its NVSwitch-side switch).
"""

from __future__ import annotations

import gzip
import re
import shutil
import stat
from pathlib import Path
from typing import Literal

from pytest_gpucluster.parsers.lspci_acs import parse_lspci
from pytest_gpucluster.parsers.nvidia_smi import parse_smi_table

DATA = Path(__file__).parents[1] / "data"
H100_QUERY = DATA / "nvidia_smi" / "ecc_q_h100x8_first2_535.161.08_gpud.txt"
H100_LSPCI = DATA / "readiness" / "lspci_vvv_hgx_h100_gpud.txt.gz"
FM_LOG = DATA / "readiness" / "fabricmanager_log_multicast_gpud.log"
Fault = Literal["fabric-manager-down", "no-peermem", "row-remap-pending", "acs-enabled"]
FAULTS: tuple[Fault, ...] = ("fabric-manager-down", "no-peermem", "row-remap-pending", "acs-enabled")
ACS_ON = "ACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
"""The ACS control line the recorded node prints on its NVSwitch-side switch ports (82:00.0)."""
DRIVER = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Release Build  (dvs-builder@U16-I3-C05-1)\n"
)
AER_COR = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
AER_UNCOR = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF",
             "MalfTLP", "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked",
             "TLPBlockedErr", "PoisonTLPBlocked")  # fmt: skip
"""The counters the kernel prints in aer_dev_correctable / aer_dev_{fatal,nonfatal} (6.x)."""
STANDINS = ("systemctl", "lspci", "journalctl", "dmesg")
_LNK = re.compile(r"Speed (?P<speed>[\d.]+)GT/s.*?Width x(?P<width>\d+)")


def install_programs(bin_dir: Path, root: Path) -> None:
    """``systemctl``, ``lspci``, ``journalctl`` and ``dmesg`` stand-ins printing the recording of
    the node they run on (``<root>/<hostname>/<program>.txt``, exit code from ``<program>.rc``)."""
    for name in STANDINS:
        script = bin_dir / name
        script.write_text(
            "#!/bin/sh\n"
            f'dir="{root}/$(hostname)"\n'
            f'if [ -f "$dir/{name}.txt" ]; then cat "$dir/{name}.txt"; fi\n'
            f'if [ -f "$dir/{name}.rc" ]; then exit "$(cat "$dir/{name}.rc")"; fi\n'
            "exit 0\n"
        )
        script.chmod(script.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)


def smi_query(table: str, fault: Fault | None = None, remap_gpu: int = 3) -> str:
    """``nvidia-smi -q`` of the node whose ``nvidia-smi`` table is ``table``: the recorded H100
    block once per GPU, at its bus id and name."""
    text = H100_QUERY.read_text()
    head, _, rest = text.partition("\nGPU ")
    block = "GPU " + rest.split("\nGPU ")[-1]  # the second GPU's block, whole
    gpus = parse_smi_table(table).gpus
    head = re.sub(r"Attached GPUs\s+: \d+", f"Attached GPUs                             : {len(gpus)}", head)
    blocks = []
    for gpu in gpus:
        bus = (gpu.bus_id or "").upper().replace("00000000:", "")
        one = re.sub(r"^GPU \S+", f"GPU 00000000:{bus}", block)
        one = re.sub(r"(Product Name\s+: ).*", rf"\g<1>{gpu.name}", one)
        one = re.sub(r"(Bus Id\s+: ).*", rf"\g<1>00000000:{bus}", one)
        if fault == "fabric-manager-down":
            one = re.sub(
                r"(Fabric\n\s+State\s+: )Completed\n(\s+Status\s+: )Success", r"\1In Progress\n\2N/A", one
            )
        if fault == "row-remap-pending" and gpu.index == remap_gpu:
            start = one.index("Remapped Rows")
            section = one[start:]
            section = re.sub(r"(Uncorrectable Error\s+: )0", r"\g<1>4", section, count=1)
            section = re.sub(r"(Pending\s+: )No", r"\1Yes", section, count=1)
            one = one[:start] + section
        blocks.append(one.rstrip("\n"))
    return head + "\n" + "\n\n".join(blocks) + "\n"


def lspci_text(fault: Fault | None = None) -> str:
    with gzip.open(H100_LSPCI, "rt") as handle:
        text = handle.read()
    if fault != "acs-enabled":
        return text
    devices = parse_lspci(text)
    gpu = next(d for d in devices if d.is_gpu)
    port = next(d for d in devices if d.is_bridge and d.secondary == gpu.domain_bus[1])
    head = f"\n{port.bdf.split(':', 1)[1]} "
    start = text.index(head)
    end = text.index("\n\n", start)
    block = re.sub(r"ACSCtl:\t[^\n]*", ACS_ON, text[start:end])
    return text[:start] + block + text[end:]


def _pci_tree(sysfs: Path, lspci: str) -> None:
    blocks = re.split(r"\n(?=[0-9a-f]{2}:[0-9a-f]{2}\.\d )", "\n" + lspci)
    for device in parse_lspci(lspci):
        text = device.description.lower()
        nvswitch = "nvidia" in text and text.startswith("bridge:")
        if not (device.is_gpu or device.is_rdma_nic or nvswitch):
            continue
        block = next(b for b in blocks if b.startswith(device.bdf.split(":", 1)[1]))
        cap, sta = re.search(r"LnkCap:\t([^\n]*)", block), re.search(r"LnkSta:\t([^\n]*)", block)
        entry = sysfs / "bus" / "pci" / "devices" / device.bdf
        entry.mkdir(parents=True)
        klass = "0x030200" if device.is_gpu else "0x068000" if nvswitch else "0x020000"
        (entry / "vendor").write_text("0x15b3\n" if device.is_rdma_nic else "0x10de\n")
        (entry / "class").write_text(f"{klass}\n")
        for prefix, found in (("max", cap), ("current", sta)):
            link = _LNK.search(found.group(1)) if found else None
            if link:
                (entry / f"{prefix}_link_speed").write_text(f"{float(link['speed']):.1f} GT/s PCIe\n")
                (entry / f"{prefix}_link_width").write_text(f"{link['width']}\n")
        (entry / "aer_dev_correctable").write_text("".join(f"{n} 0\n" for n in AER_COR) + "TOTAL_ERR_COR 0\n")
        (entry / "aer_dev_fatal").write_text("".join(f"{n} 0\n" for n in AER_UNCOR) + "TOTAL_ERR_FATAL 0\n")
        (entry / "aer_dev_nonfatal").write_text(
            "".join(f"{n} 0\n" for n in AER_UNCOR) + "TOTAL_ERR_NONFATAL 0\n"
        )


def _proc_tree(proc: Path) -> None:
    (proc / "self").mkdir(parents=True)
    limits = Path("/proc/self/limits").read_text()
    limits = re.sub(
        r"(?m)^Max locked memory.*$",
        f"{'Max locked memory':<26}{'unlimited':<21}{'unlimited':<21}bytes     ",
        limits,
    )
    (proc / "self" / "limits").write_text(limits)
    (proc / "driver" / "nvidia").mkdir(parents=True)
    (proc / "driver" / "nvidia" / "version").write_text(DRIVER)
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "osrelease").write_text("5.15.0-1053-nvidia\n")
    (proc / "cmdline").write_text("BOOT_IMAGE=/vmlinuz-5.15.0-1053-nvidia root=/dev/md0 ro iommu=pt\n")
    for pid, comm in ((1, "systemd"), (2, "kthreadd")):
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "stat").write_text(
            f"{pid} ({comm}) S 0 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 3 0 0\n"
        )


def write_node(node_dir: Path, sysfs: Path, proc: Path, table: str, fault: Fault | None = None) -> None:
    """Everything the readiness probe reads on one recorded node, with ``fault`` if given."""
    node_dir.mkdir(parents=True, exist_ok=True)
    (node_dir / "nvidia-smi-q.txt").write_text(smi_query(table, fault))
    lspci = lspci_text(fault)
    (node_dir / "lspci.txt").write_text(lspci)
    down = fault == "fabric-manager-down"
    (node_dir / "systemctl.txt").write_text("inactive\n" if down else "active\n")
    (node_dir / "systemctl.rc").write_text("3\n" if down else "0\n")
    kernel = "[    0.000000] Linux version 5.15.0-1053-nvidia (buildd@lcy02-amd64-050)\n"
    (node_dir / "journalctl.txt").write_text(kernel)
    (node_dir / "dmesg.txt").write_text(kernel)
    shutil.copy(FM_LOG, node_dir / "fabricmanager.log")
    _pci_tree(sysfs, lspci)
    for module in ("nvidia", "nvidia_peermem"):
        if not (module == "nvidia_peermem" and fault == "no-peermem"):
            (sysfs / "module" / module).mkdir(parents=True, exist_ok=True)
    for group in range(4):
        (sysfs / "kernel" / "iommu_groups" / str(group)).mkdir(parents=True)
        (sysfs / "kernel" / "iommu_groups" / str(group) / "type").write_text("identity\n")
    _proc_tree(proc)
