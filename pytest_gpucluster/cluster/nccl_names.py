"""Which ``NCCL_*`` environment variable names NCCL knows, and redaction of secrets before an env is shown.

A misspelt NCCL variable is silently ignored by NCCL (``NCCL_IB_HCAS=mlx5_0`` leaves every HCA in use),
so :func:`unknown_nccl_names` flags names NCCL does not document and suggests the closest one it does.
:func:`redact_env` is applied to every environment a report, a log or an error message shows.

Sources for :data:`NCCL_NAMES`: the "Environment Variables" page of the NCCL user guide
(docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html) -- its contents at releases 2.4.8, 2.11.4,
2.15.5 and 2.18, plus the names the current page adds for 2.19 to 2.27 (IB merging and retries, RAS,
MNNVL, CTA policy, window registration...); the "Logging" page (NCCL_DEBUG_TIMESTAMP_*); and, in
``_SOURCE_ONLY``, a few names NCCL reads (``NCCL_PARAM`` in its source) that clusters set although the
page does not list them. Old names NCCL still accepts stay (NCCL_IB_GDR_LEVEL, NCCL_MAX_NRINGS...).

Pure standard library; no other import.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "IMAGE_NAMES",
    "NCCL_NAMES",
    "REDACTED",
    "UnknownName",
    "is_secret_name",
    "redact_env",
    "unknown_nccl_names",
]

_DOCUMENTED = """
NCCL_SOCKET_IFNAME NCCL_SOCKET_FAMILY NCCL_SOCKET_RETRY_CNT NCCL_SOCKET_RETRY_SLEEP_MSEC
NCCL_SOCKET_NTHREADS NCCL_NSOCKS_PERTHREAD NCCL_CROSS_NIC
NCCL_IB_HCA NCCL_IB_TIMEOUT NCCL_IB_RETRY_CNT NCCL_IB_GID_INDEX NCCL_IB_ADDR_FAMILY NCCL_IB_ADDR_RANGE
NCCL_IB_ROCE_VERSION_NUM NCCL_IB_SL NCCL_IB_TC NCCL_IB_FIFO_TC NCCL_IB_RETURN_ASYNC_EVENTS
NCCL_IB_DISABLE NCCL_IB_AR_THRESHOLD NCCL_IB_QPS_PER_CONNECTION NCCL_IB_SPLIT_DATA_ON_QPS
NCCL_IB_CUDA_SUPPORT NCCL_IB_PCI_RELAXED_ORDERING NCCL_IB_ADAPTIVE_ROUTING NCCL_IB_ECE_ENABLE
NCCL_IB_MERGE_VFS NCCL_IB_MERGE_NICS NCCL_IB_MQP_RETRY_ALL NCCL_IB_MQP_RETRY_CNT NCCL_IB_MQP_RETRY_SLEEP_MSEC
NCCL_OOB_NET_ENABLE NCCL_OOB_NET_IFNAME NCCL_UID_STAGGER_THRESHOLD NCCL_UID_STAGGER_RATE
NCCL_NET NCCL_NET_PLUGIN NCCL_TUNER_PLUGIN NCCL_PROFILER_PLUGIN NCCL_ENV_PLUGIN
NCCL_NET_GDR_LEVEL NCCL_IB_GDR_LEVEL NCCL_NET_GDR_READ NCCL_NET_GDR_C2C NCCL_NET_SHARED_BUFFERS
NCCL_NET_SHARED_COMMS NCCL_NETDEVS_POLICY
NCCL_IGNORE_CPU_AFFINITY NCCL_CONF_FILE
NCCL_DEBUG NCCL_DEBUG_FILE NCCL_DEBUG_SUBSYS NCCL_DEBUG_TIMESTAMP_FORMAT NCCL_DEBUG_TIMESTAMP_LEVELS
NCCL_COLLNET_ENABLE NCCL_COLLNET_NODE_THRESHOLD NCCL_CTA_POLICY
NCCL_TOPO_FILE NCCL_TOPO_DUMP_FILE NCCL_SET_THREAD_NAME
NCCL_P2P_DISABLE NCCL_P2P_LEVEL NCCL_P2P_DIRECT_DISABLE NCCL_SHM_DISABLE
NCCL_BUFFSIZE NCCL_NTHREADS NCCL_MAX_NCHANNELS NCCL_MIN_NCHANNELS NCCL_RINGS NCCL_MAX_NRINGS NCCL_MIN_NRINGS
NCCL_CHECKS_DISABLE NCCL_CHECK_POINTERS NCCL_LAUNCH_MODE
NCCL_MEM_SYNC_DOMAIN NCCL_CUMEM_ENABLE NCCL_CUMEM_HOST_ENABLE
NCCL_SINGLE_RING_THRESHOLD NCCL_LL_THRESHOLD NCCL_TREE_THRESHOLD NCCL_ALGO NCCL_PROTO
NCCL_NVB_DISABLE NCCL_PXN_DISABLE NCCL_P2P_PXN_LEVEL NCCL_PXN_C2C NCCL_RUNTIME_CONNECT
NCCL_GRAPH_REGISTER NCCL_LOCAL_REGISTER NCCL_LEGACY_CUDA_REGISTER NCCL_WIN_ENABLE
NCCL_SET_STACK_SIZE NCCL_GRAPH_MIXING_SUPPORT NCCL_DMABUF_ENABLE
NCCL_P2P_NET_CHUNKSIZE NCCL_P2P_NVL_CHUNKSIZE NCCL_P2P_PCI_CHUNKSIZE NCCL_P2P_LL_THRESHOLD NCCL_ALLOC_P2P_NET_LL_BUFFERS
NCCL_COMM_BLOCKING NCCL_CGA_CLUSTER_SIZE NCCL_MAX_CTAS NCCL_MIN_CTAS NCCL_NCHANNELS_PER_NET_PEER
NCCL_NVLS_ENABLE NCCL_NVLS_CHUNKSIZE NCCL_MNNVL_ENABLE NCCL_MNNVL_UUID NCCL_MNNVL_CLIQUE_ID
NCCL_WORK_FIFO_BYTES NCCL_WORK_FIFO_DEPTH
NCCL_RAS_ENABLE NCCL_RAS_ADDR NCCL_RAS_TIMEOUT_FACTOR
"""

# Read by NCCL but absent from the env page; people set them, so they must not be reported as typos.
_SOURCE_ONLY = """
NCCL_COMM_ID NCCL_HOSTID NCCL_IB_PKEY NCCL_IB_USE_INLINE NCCL_IB_ROUTABLE_FLID_GID_INDEX
NCCL_NET_OVERHEAD NCCL_NVLS_NCHANNELS
"""

NCCL_NAMES: frozenset[str] = frozenset((_DOCUMENTED + _SOURCE_ONLY).split())

# Names that start with NCCL_ but belong to something else, so NCCL's list says nothing about them:
# the HPC-X / nccl-rdma-sharp-plugins (NCCL_IBEXT_*, NCCL_SHARP_*), Google's TCPX/FasTrak plugins,
# nccl-tests, and PyTorch's pre-2.2 spellings of its TORCH_NCCL_* variables.
_OTHER_OWNERS = ("NCCL_IBEXT_", "NCCL_SHARP_", "NCCL_GPUDIRECTTCPX_", "NCCL_FASTRAK_", "NCCL_TESTS_")
_PYTORCH_LEGACY = frozenset(
    {"NCCL_ASYNC_ERROR_HANDLING", "NCCL_BLOCKING_WAIT", "NCCL_DESYNC_DEBUG", "NCCL_ENABLE_TIMING"}
)

# Set by NVIDIA's container images, not read by NCCL: the CUDA images' Dockerfiles carry
# ``ENV NCCL_VERSION 2.17.1-1`` (the libnccl2 package they install), every PyTorch NGC image too. On
# the real H200 run (issue 26) it said 2.28.3 while torch loaded 2.28.9. Never a typo: not warned
# about; the preflight says which NCCL each node loaded against it (INFO).
IMAGE_NAMES: frozenset[str] = frozenset({"NCCL_VERSION"})

# Close enough to be the name someone meant; compared without the shared "NCCL_" so it does not inflate.
_SUGGESTION_CUTOFF = 0.75


@dataclass(frozen=True, slots=True)
class UnknownName:
    """An ``NCCL_*`` name NCCL does not know, and the documented name it is closest to (or None)."""

    name: str
    suggestion: str | None

    def __str__(self) -> str:
        hint = f"; did you mean {self.suggestion}?" if self.suggestion else ""
        return f"{self.name} is not an NCCL environment variable, so NCCL ignores it{hint}"


def unknown_nccl_names(env: Mapping[str, str]) -> list[UnknownName]:
    """Every ``NCCL_*`` name in ``env`` that NCCL does not know, in ``env`` order.

    Lower-case spellings (``nccl_debug``) are reported too: NCCL reads only the exact upper-case name.
    """
    unknown = []
    for name in env:
        upper = name.upper()
        if (
            not upper.startswith("NCCL_")
            or name in NCCL_NAMES
            or name in _PYTORCH_LEGACY
            or name in IMAGE_NAMES
        ):
            continue
        if upper.startswith(_OTHER_OWNERS) and name == upper:
            continue
        unknown.append(UnknownName(name, upper if upper in NCCL_NAMES else _closest(upper)))
    return unknown


def _closest(name: str) -> str | None:
    tails = {known[5:]: known for known in NCCL_NAMES}
    match = difflib.get_close_matches(name[5:], list(tails), n=1, cutoff=_SUGGESTION_CUTOFF)
    return tails[match[0]] if match else None


REDACTED = "<redacted>"

# A name is secret when one of its words (split at "_", "-", ".") is one of these...
_SECRET_WORDS = frozenset(
    {"TOKEN", "TOKENS", "KEY", "KEYS", "APIKEY", "AUTH", "OAUTH", "AUTHORIZATION", "COOKIE", "CREDS"}
)
# ...or when it contains one of these anywhere (long enough never to be part of an innocent word).
_SECRET_PARTS = ("SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "PRIVATE_KEY", "ACCESS_KEY")
# Credentials embedded in a URL value, e.g. PIP_INDEX_URL=https://user:pass@host/simple.
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][\w+.-]*://)[^/\s:@]+:[^/\s@]+@")


def is_secret_name(name: str) -> bool:
    """Whether a variable's value must never be shown.

    Whole words only for the short markers, so ``TOKENIZERS_PARALLELISM`` and ``NCCL_IB_PKEY`` stay
    visible: the InfiniBand partition key is fabric configuration that a failed run needs to show,
    not a credential.
    """
    upper = name.upper()
    words = set(re.split(r"[_.\-]+", upper))
    return bool(words & _SECRET_WORDS) or any(part in upper for part in _SECRET_PARTS)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` safe to print: secret values replaced by ``<redacted>``.

    An empty secret stays empty (that it is unset is worth seeing); a password inside a URL value is
    replaced even when the variable's name looks harmless.
    """
    shown = {}
    for name, value in env.items():
        if is_secret_name(name) and value:
            shown[name] = REDACTED
        else:
            shown[name] = _URL_USERINFO.sub(rf"\g<scheme>{REDACTED}@", value)
    return shown
