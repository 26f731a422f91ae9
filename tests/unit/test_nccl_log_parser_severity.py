"""Which NCCL WARNs are errors (parsers/nccl_log/severity.py), on WARN texts NCCL and its plugins print.

Messages are quoted from the recorded logs in tests/data/nccl_logs (SOURCES.md) or, where no public log
shows one, NCCL's own format string from its source (NVIDIA/nccl v2.27.7-1, ``WARN("...")``) with the
``%d``/``%s`` filled in; the id says which.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpucluster.parsers.nccl_log import benign_reason, failure_kind, parse_nccl_log
from pytest_gpucluster.parsers.nccl_log.records import iter_records

LOGS = Path(__file__).resolve().parent.parent / "data" / "nccl_logs"


@pytest.mark.parametrize(
    ("message", "source", "reason"),
    [
        pytest.param(
            "CollNet is not supported or fails to initialize, ignoring NCCL_ALGO=COLLNET",
            "graph/tuning.cc:187",
            "ignored setting",
            id="log-nccl-tests133",
        ),
        pytest.param(
            "Call to bind failed: Address already in use",
            "ras/client_support.cc:159",
            "RAS side service",
            id="log-2.27-RAS",
        ),
        pytest.param("Failed to open libibverbs.so[.1]", None, "RDMA library absent", id="log-2.4.8-nccl259"),
        pytest.param(
            "NCCL_WORK_FIFO_BYTES=1000 is being ignored because it is not a power of 2.",
            "enqueue.cc:99",
            "ignored setting",
            id="src-fifo-bytes",
        ),
        pytest.param(
            "NET/Socket : NCCL_SOCKET_NTHREADS is greater than the maximum allowed, setting to 16",
            None,
            "clamped setting",
            id="src-socket-nthreads",
        ),
        pytest.param(
            "Cannot initialize CollNet, using point-to-point network instead",
            None,
            "fallback",
            id="src-collnet",
        ),
        pytest.param(
            "Profiler init failed with error (3). Continue without profiler.",
            None,
            "fallback",
            id="src-profiler",
        ),
        pytest.param("CUMEM not supported prior to CUDA 11.3", None, "older driver or CUDA", id="src-cumem"),
        pytest.param(
            "NET/OFI WARNING: Use of OFI_NCCL_CQ_READ_COUNT is deprecated.",
            None,
            "deprecated setting",
            id="src-aws-ofi",
        ),
        pytest.param(
            "NET/OFI GDR disabled on GDR-supported instance type p4d.24xlarge",
            None,
            "GDR notice",
            id="src-aws-ofi-gdr",
        ),
    ],
)
def test_benign_warns_stay_warnings(message: str, source: str | None, reason: str) -> None:
    assert benign_reason(message, source) == reason


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        pytest.param("Call to ibv_create_qp failed", "verbs call failed", id="log-nccl562"),
        pytest.param("Call to ibv_create_cq failed", "verbs call failed", id="log-nccl380"),
        pytest.param("NET/IB : Unable to open device mlx5_59", "verbs call failed", id="log-imagereward65"),
        pytest.param(
            "NET/IB : Got completion from peer 10.0.35.1<49189> with error 4, opcode 5327, len 5327, vendor err 81 (Send)",
            "network completion error",
            id="log-nccl-tests252",
        ),
        pytest.param(
            "socketProgress: Connection closed by remote peer node1<57557>",
            "connection closed",
            id="log-nccl-tests166",
        ),
        pytest.param(
            "socketStartConnect: Connect to 10.0.0.2<45763> failed : Software caused connection abort",
            "connection failed",
            id="log-nccl-tests166-connect",
        ),
        pytest.param(
            "[Proxy Service 0] Failed to execute operation Connect from rank 0, retcode 2",
            "proxy failure",
            id="log-nccl-tests166-proxy",
        ),
        pytest.param("Error: network AWS Libfabric not found.", "network not found", id="log-cscs"),
        pytest.param(
            "NET/OFI Couldn't open AV. RC: -22, ERROR: Invalid argument",
            "libfabric (aws-ofi-nccl) failure",
            id="log-ofi24",
        ),
        pytest.param(
            "Call to connect failed : Connection refused", "connection failed", id="log-2.0-nccl111"
        ),
        pytest.param(
            "SHARP group create: Streaming Tree lock failed (-18)", "SHARP/CollNet failure", id="log-nccl1219"
        ),
        pytest.param(
            "MNNVL (cliqueSize 4) is available but not working on this system. Check the IMEX configuration "
            "(nvidia-imex-ctl -N). Set NCCL_MNNVL_ENABLE=0 to ignore this issue.",
            "failure",
            id="src-mnnvl-says-ignore-but-fails",
        ),
        pytest.param(
            "Message truncated : received 8 bytes instead of 16", "failure", id="src-truncated-instead-of"
        ),
        pytest.param(
            "Attempt to use communicator before the previous operation returned ncclSuccess",
            "failure",
            id="src-unknown-wording-is-an-error",
        ),
    ],
)
def test_failures_at_warn_level_are_errors(message: str, kind: str) -> None:
    assert benign_reason(message) is None
    assert failure_kind(message) == kind


def test_the_watchdog_timeout_of_pytorch_is_an_error_line() -> None:
    """GPU behaviour: a collective that never completes (a dead link, a hung peer) surfaces as PyTorch's
    NCCL watchdog timeout, not as an NCCL WARN. Line quoted from search-index file id 60709612778."""
    line = (
        "[rank1]:[E724 20:42:34.306947846 ProcessGroupNCCL.cpp:2119] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
        "Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=2415, OpType=ALLREDUCE, NumelIn=8192, NumelOut=8192, Timeout(ms)=1800000) ran "
        "for 1800058 milliseconds before timing out."
    )
    text = (LOGS / "p2p_cumem_socket_2.28.9.log").read_text() + line + "\n"
    [error] = parse_nccl_log(text).errors
    assert error.value == line and failure_kind(line) == "timeout"


def test_pytorch_nccl_env_deprecation_is_a_warning_not_an_error() -> None:
    """PyTorch's ``Environment variable NCCL_ASYNC_ERROR_HANDLING is deprecated`` notice (line quoted from
    https://github.com/ray-project/ray/issues/47286) is the deprecated-variable notice users see most."""
    line = (
        "(RayTrainWorker pid=2273, ip=172.24.21.66) [rank7]:[W Utils.hpp:108] Warning: Environment variable "
        "NCCL_ASYNC_ERROR_HANDLING is deprecated; use TORCH_NCCL_ASYNC_ERROR_HANDLING instead (function getCvarString)"
    )
    log = parse_nccl_log((LOGS / "p2p_cumem_socket_2.28.9.log").read_text() + line + "\n")
    assert [w.value for w in log.warnings] == [line] and log.errors == ()


def test_a_log_mixing_benign_and_failing_warns_keeps_them_apart() -> None:
    """GPU behaviour: NCCL 2.27 in a container whose RAS port is taken (benign) next to, in another
    log, a verbs failure (error): each lands on its own side, with where NCCL printed it."""
    ras = parse_nccl_log((LOGS / "rdma_plugin_v6_tencent_socket_ras_warn_2.27.3.log").read_text())
    assert [(w.value, w.note) for w in ras.warnings] == [
        ("Call to bind failed: Address already in use", "ras/client_support.cc:159")
    ]
    assert ras.warnings[0].evidence.text.startswith("[2025-08-22 17:44:36] A800:6801:6839 [1]")
    qp = parse_nccl_log((LOGS / "ibv_create_qp_ibext_2.8.3_nccl562.log").read_text())
    assert [(e.note, e.evidence.line_no) for e in qp.errors] == [
        ("ibvwrap.c:130", 4),
        ("ibvwrap.c:130", 14),
        ("ibvwrap.c:130", 16),
    ]
    assert qp.to_json()["errors"] == ["Call to ibv_create_qp failed"]  # de-duplicated in the JSON


def test_glued_records_are_split_and_a_long_host_is_merged_into_its_process() -> None:
    """Records level: the vLLM line where rank 1's first record starts inside rank 0's half line.
    A variant puts a fact (rank 1's own cudaDriverVersion record from line 49) in the glued record,
    to show the merged source keeps it under ``proxmox``."""
    lines = (LOGS / "p2p_disabled_shm_gdr1_ring_vllm_2.28.9.log").read_text().splitlines()
    glued = lines[47]
    records = list(iter_records(glued + "\n"))
    assert [r.key for r in records] == [("proxmox", 1495819, 0), ("0.000proxmox", 1495820, 1)]
    assert (
        records[1].text
        == "0.000proxmox:1495820:1495820 [1] NCCL INFO ENV/Plugin: Could not find: libnccl-env.so"
    )
    variant = glued.replace("ENV/Plugin: Could not find: libnccl-env.so", lines[48].split("NCCL INFO ", 1)[1])
    log = parse_nccl_log("\n".join([*lines[:47], variant, *lines[48:]]) + "\n")
    [rank1] = [r for r in log.per_rank if r.pid == 1495820]  # one source, under the shorter host name
    assert rank1.key == "proxmox:1495820[1]"
    assert rank1.cuda_driver_version.evidence.line_no == 48  # the glued record's fact, the earliest
