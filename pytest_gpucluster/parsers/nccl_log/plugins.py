"""The external net plugin: which one NCCL loaded, as NCCL names it, or why none loaded.

One job: read the plugin lines of NCCL 2.4 to 2.28 (and of the plugins themselves) into a
:class:`PluginLines` per rank, then assemble a :class:`~.model.NetPlugin`. Imports only the standard
library and ``model``.

The wordings, oldest first (``NET/Plugin :`` with a space before 2.19, ``NET/Plugin:`` after):

* loaded: ``NET/Plugin: Loaded net plugin NCCL RDMA Plugin v8 (v8)`` (2.12+; the name is the
  plugin's, the parenthesised ``vN`` NCCL's plugin API), ``Successfully loaded external plugin
  libnccl-net.so`` (2.27), ``Successfully loaded external network plugin /opt/.../libnccl-net.so``
  (2.28); the plugins' own lines ``NET/OFI Initializing aws-ofi-nccl 1.16.2`` (``NET/OFI Using
  aws-ofi-nccl 1.3.0aws`` before 1.7), HPC-X's ``Plugin Path : /opt/hpcx/...`` and ``P2P plugin
  IBext_v8``, a fork's ``Plugin version : 1.3@Tencent Cloud``;
* none loaded: ``NET/Plugin : No plugin found (libnccl-net.so).`` (2.4), ``..., using internal
  implementation`` (2.7-2.16), ``Plugin load returned 2 : ...`` / ``Plugin load (libnccl-net.so)
  returned 2 : ...`` (2.18), ``dlerror=... No plugin found`` (2.19), ``Plugin load returned ... when
  loading`` and ``Using internal network plugin.`` (2.21), ``Could not find: libnccl-net.so. Using
  internal network plugin.`` (2.23+).

``Loaded collnet plugin SHARP`` and the ``TUNER/``, ``PROFILER/``, ``ENV/``, ``GIN/`` plugins are
other plugins and are not read as the net plugin; nor are NCCL's internal ``IB``/``Socket``
transports that 2.27+ names in ``Initialized NET plugin IB``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from pytest_gpucluster.parsers.nccl_log.model import Evidence, Fact, NetPlugin

__all__ = ["PluginLines", "read_plugin_line"]

_LOADED = re.compile(r"Loaded net plugin (?P<name>.+?)(?: (?P<ver>v\d+))? \((?P<api>v\d+)\)")
_EXTERNAL = re.compile(r"Successfully loaded external (?:network )?plugin (\S+)")
_PATH = re.compile(r"Plugin Path : (\S+)")
_RELEASE = re.compile(r"Plugin version : (\S.*?)\s*$")
_OFI = re.compile(r"NET/OFI (?:Initializing|Using) aws-ofi-nccl (\S+)")
_FAILED = re.compile(
    r"NET/Plugin ?: (?:No plugin found|Plugin load|Most recent plugin load|dlerror=|Could not find"
    r"|Using internal network plugin|lib\S*\.so\S*: )"
    r"|Unable to load libnccl-net|Failed to open libnccl-net"
)


@dataclass
class PluginLines:
    """The plugin lines one rank printed; the first of each kind counts."""

    loaded: Fact | None = None  # (name, version-in-name, api)
    external: Fact | None = None  # library from "Successfully loaded external plugin"
    path: Fact | None = None
    release: Fact | None = None
    ofi: Fact | None = None  # aws-ofi-nccl release
    failed: Fact | None = None

    def plugin(self) -> Fact | None:
        """The net plugin this rank loaded, with the line that names it best; None if none loaded."""
        named = self.loaded or self.ofi or self.path or self.external
        if named is None:
            return None
        name, version, api = self.loaded.value if self.loaded else (None, None, None)
        library = (self.path or self.external).value if (self.path or self.external) else None
        release = self.ofi.value if self.ofi else self.release.value if self.release else None
        project = _project(name, library, self.ofi is not None)
        name = name or ("aws-ofi-nccl" if self.ofi else project or _basename(library or "libnccl-net.so"))
        version = version or (self.ofi.value if self.ofi else None)  # aws-ofi-nccl's name carries none
        plugin = NetPlugin(name, version, api, library, release, project)
        return Fact(plugin, named.evidence)

    def absorb(self, other: PluginLines) -> None:
        """Fill what this rank did not say from another record of the same process."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) or getattr(other, f.name))

    def error(self) -> Fact | None:
        """Why no external plugin loaded, when none did."""
        return None if self.plugin() else self.failed


def read_plugin_line(lines: PluginLines, msg: str, ev: Evidence) -> bool:
    """Record what one message says about the net plugin; True when it said something."""
    for attr, pattern in (
        ("loaded", _LOADED),
        ("external", _EXTERNAL),
        ("path", _PATH),
        ("release", _RELEASE),
        ("ofi", _OFI),
    ):
        if m := pattern.search(msg):
            if getattr(lines, attr) is None:
                value = (m.group("name"), m.group("ver"), m.group("api")) if attr == "loaded" else m.group(1)
                setattr(lines, attr, Fact(value, ev))
            return True
    if _FAILED.search(msg):
        if lines.failed is None:
            lines.failed = Fact(msg.strip(), ev)
        return True
    return False


def _project(name: str | None, library: str | None, ofi: bool) -> str | None:
    if ofi or name in ("Libfabric", "AWS Libfabric"):
        return "aws-ofi-nccl"
    if (name or "").startswith("NCCL RDMA Plugin") or "nccl_rdma_sharp_plugin" in (library or ""):
        return "nccl-rdma-sharp-plugins"
    return None


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]
