"""PCIe Access Control Services on the GPU <-> NIC path, from ``lspci -vvv``.

GPUDirect RDMA moves data between a GPU and a NIC under the same PCIe switch without the CPU.
With ACS *redirection* enabled on a switch port (``ACSCtl: ... ReqRedir+ CmpltRedir+``, often set
by the BIOS or an IOMMU-enabled kernel), peer-to-peer requests are sent up to the root complex
instead: on bare metal they are slower or blocked, and NCCL's GDR bandwidth collapses. NVIDIA's
GPUDirect and NCCL troubleshooting guides say: disable ACS on bare metal (in the BIOS, or
``setpci`` at boot). ``SrcValid+`` alone (source validation) does not redirect and is not judged.

`parse_lspci` reads each device block (``17:01.0 PCI bridge: ...``): its class text, the bridge's
bus range (``Bus: primary=17, secondary=19, subordinate=19``), and the ACS control line; a block
whose extended capabilities lspci could not read (``Capabilities: <access denied>``: not root)
is marked so. `acs_on_gpu_nic_path` returns the bridges with redirection enabled that sit in a
subtree holding both a GPU and an RDMA NIC. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["PciDevice", "acs_on_gpu_nic_path", "parse_lspci"]

_HEAD = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{4}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])\s+(?P<desc>.+)$"
)
_BUS = re.compile(
    r"Bus:\s+primary=(?P<p>[0-9a-fA-F]{2}),\s*secondary=(?P<s>[0-9a-fA-F]{2}),\s*subordinate=(?P<u>[0-9a-fA-F]{2})"
)
_FLAG = re.compile(r"(\w+)([+-])")
REDIRECT_FLAGS = ("ReqRedir", "CmpltRedir")
"""The ACS controls that send peer-to-peer traffic up to the root complex."""


@dataclass(frozen=True, slots=True)
class PciDevice:
    bdf: str
    """``0000:17:01.0``."""
    description: str
    secondary: int | None = None
    subordinate: int | None = None
    acs_ctl: dict[str, bool] | None = field(default=None, hash=False)
    caps_denied: bool = False

    @property
    def domain_bus(self) -> tuple[str, int]:
        domain, bus, _ = self.bdf.split(":")
        return domain, int(bus, 16)

    @property
    def is_bridge(self) -> bool:
        return self.secondary is not None

    @property
    def is_gpu(self) -> bool:
        text = self.description.lower()
        return "nvidia" in text and ("3d controller" in text or "vga compatible" in text)

    @property
    def is_rdma_nic(self) -> bool:
        text = self.description.lower()
        return ("infiniband controller" in text or "ethernet controller" in text) and (
            "mellanox" in text or "broadcom inc. and subsidiaries bcm57" in text or "connectx" in text
        )

    @property
    def redirects(self) -> bool:
        return bool(self.acs_ctl) and any(self.acs_ctl.get(flag) for flag in REDIRECT_FLAGS)  # type: ignore[union-attr]

    def below(self, bridge: PciDevice) -> bool:
        """Whether this device sits under ``bridge`` (its bus within the bridge's range)."""
        if bridge.secondary is None or bridge.subordinate is None:
            return False
        domain, bus = self.domain_bus
        return domain == bridge.domain_bus[0] and bridge.secondary <= bus <= bridge.subordinate


def parse_lspci(text: str) -> list[PciDevice]:
    """Every device block of ``lspci -vvv`` (with or without ``-D`` domains)."""
    devices: list[PciDevice] = []
    current: dict | None = None

    def close() -> None:
        if current is not None:
            devices.append(PciDevice(**current))

    for line in text.splitlines():
        head = _HEAD.match(line) if line and not line[0].isspace() else None
        if head:
            close()
            domain = (head["domain"] or "0000").lower()
            current = {"bdf": f"{domain}:{head['bus'].lower()}:{head['dev'].lower()}.{head['fn']}",
                       "description": head["desc"].strip()}  # fmt: skip
            continue
        if current is None:
            continue
        stripped = line.strip()
        if bus := _BUS.search(stripped):
            current["secondary"], current["subordinate"] = int(bus["s"], 16), int(bus["u"], 16)
        elif stripped.startswith("ACSCtl:"):
            current["acs_ctl"] = {name: sign == "+" for name, sign in _FLAG.findall(stripped[7:])}
        elif stripped == "Capabilities: <access denied>":
            current["caps_denied"] = True
    close()
    return devices


def acs_on_gpu_nic_path(devices: Sequence[PciDevice]) -> list[PciDevice]:
    """Bridges with ACS redirection enabled that lie on a path between a GPU and an RDMA NIC: under
    a bridge (or being one) whose subtree holds both a GPU and a NIC, and above one of them."""
    bridges = [d for d in devices if d.is_bridge]
    ends = [d for d in devices if d.is_gpu or d.is_rdma_nic]
    shared = [b for b in bridges if any(e.is_gpu and e.below(b) for e in ends)
              and any(e.is_rdma_nic and e.below(b) for e in ends)]  # fmt: skip
    found = []
    for bridge in bridges:
        if not bridge.redirects or not any(e.below(bridge) for e in ends):
            continue
        if bridge in shared or any(bridge.below(top) for top in shared):
            found.append(bridge)
    return found
