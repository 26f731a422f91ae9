"""The NCCL log parser on the issue-17 samples (tests/data/nccl_logs, SOURCES.md): failures at WARN level,
net plugin names across NCCL 2.7-2.28, GDR, P2P/SHM/NET/NVLS transports, glued and prefixed lines.

Each test says which GPU-cluster behaviour the recorded log stands for; the facts were read off the files
by eye."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpucluster.cli import main
from pytest_gpucluster.parsers.nccl_log import NcclLog, p2p_or_nvls_connections, parse_nccl_log

LOGS = Path(__file__).resolve().parent.parent / "data" / "nccl_logs"


def parse(name: str) -> NcclLog:
    return parse_nccl_log((LOGS / name).read_text(encoding="utf-8"))


def plugin(name: str, **kwargs: str | None) -> dict[str, str | None]:
    fields = {"version": None, "api": None, "library": None, "release": None, "project": None}
    return {"name": name, **fields, **kwargs}


# One row per recorded log: the facts it states, as to_json gives them.
FACTS = [
    pytest.param(
        "network_not_found_ofi_cscs_docs.log",
        {
            "net_plugin": None,
            "net_plugin_error": "NET/Plugin: Could not find: ofi libnccl-net-ofi.so. Using internal network plugin.",
            "warnings": [],
            "errors": ["Error: network AWS Libfabric not found."],
            "error_lines": [
                "line 3: nid006365:180142:180163 [0] net.cc:626 NCCL WARN Error: network AWS Libfabric not found."
            ],
        },
        id="network-not-found-is-an-error",
    ),
    pytest.param(
        "ibv_create_qp_ibext_2.8.3_nccl562.log",
        {
            "nccl_version": "2.8.3+cudaCUDA_MAJOR.CUDA_MINOR",
            "network": "IBext",
            "errors": ["Call to ibv_create_qp failed"],
            "warnings": [],
        },
        id="ibv_create_qp-2.8.3-bazel-build",
    ),
    pytest.param(
        "ibv_create_cq_roce_2.7.8_nccl380.log",
        {
            "nccl_version": "2.7.8+cuda11.0",
            "network": "IB",
            "link_layers": ["RoCE"],
            "gdr": False,
            "transports": ["NET/IB"],
            "errors": ["Call to ibv_create_cq failed"],
        },
        id="ibv_create_cq-RoCE-2.7.8",
    ),
    pytest.param(
        "ibv_open_device_k8s_imagereward65.log",
        {
            "network": "IB",
            "link_layers": ["RoCE"],
            "errors": [
                "Call to ibv_open_device failed",
                "NET/IB : Unable to open device mlx5_59",
                "NET/IB : Unable to open device mlx5_58",
            ],
        },
        id="ibv_open_device-then-IB-anyway",
    ),
    pytest.param(
        "ib_completion_error4_nccl_tests252.log",
        {
            "errors": [
                "NET/IB : Got completion from peer 10.0.35.1<49189> with error 4, opcode 5327, len 5327, "
                "vendor err 81 (Send)"
            ],
            "warnings": [],
        },
        id="IB-completion-error-4",
    ),
    pytest.param(
        "socket_connect_abort_proxy_nccl_tests166.log",
        {
            "transports": ["SHM"],
            "errors": [
                "socketStartConnect: Connect to 10.0.0.2<45763> failed : Software caused connection abort",
                "[Proxy Service 0] Failed to execute operation Connect from rank 0, retcode 2",
                "socketProgress: Connection closed by remote peer node1<57557>",
                "Socket recv failed while polling for opId=0x7f6f18cb7f40",
            ],
        },
        id="socket-connect-abort-proxy-closed-peer",
    ),
    pytest.param(
        "collnet_ignored_warn_gdrdma_p2p_read_nccl_tests133.log",
        {
            "network": "IB",
            "gdr": True,
            "transports": ["P2P/direct pointer", "NET/IB/GDRDMA"],
            "warnings": ["CollNet is not supported or fails to initialize, ignoring NCCL_ALGO=COLLNET"],
            "errors": [],
        },
        id="benign-WARN-GDRDMA-P2P-direct-pointer",
    ),
    pytest.param(
        "rdma_plugin_v6_tencent_socket_ras_warn_2.27.3.log",
        {
            "nccl_version": "2.27.3+cuda12.9",
            "network": "Socket",
            "net_plugin": plugin(
                "NCCL RDMA Plugin",
                version="v6",
                api="v6",
                library="/usr/local/lib/libnccl-net.so",
                release="1.3@Tencent Cloud",
                project="nccl-rdma-sharp-plugins",
            ),
            "gdr": None,
            "transports": ["SHM"],
            "warnings": ["Call to bind failed: Address already in use"],
            "errors": [],
            "nranks": 2,
        },
        id="RDMA-plugin-v6-2.27-RAS-WARN-benign",
    ),
    pytest.param(
        "rdma_plugin_v8_hpcx_2.26.2_lccn.log",
        {
            "nccl_version": "2.26.2+cuda12.8",
            "net_plugin": plugin(
                "NCCL RDMA Plugin",
                version="v8",
                api="v8",
                library="/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
                project="nccl-rdma-sharp-plugins",
            ),
        },
        id="RDMA-plugin-v8-HPC-X-2.26",
    ),
    pytest.param(
        "rdma_plugin_v5_p2p_direct_pointer_h800_nccl892.log",
        {
            "net_plugin": plugin("NCCL RDMA Plugin", api="v5", project="nccl-rdma-sharp-plugins"),
            "transports": ["P2P/direct pointer"],
            "nvls": None,
            "nvls_used": False,
            "environment": {"NCCL_ALGO": "Tree,Ring,,CollnetDirect,CollnetChain,NVLS"},
        },
        id="RDMA-plugin-v5-no-version-in-name",
    ),
    pytest.param(
        "efa_aws_ofi_1.3.0aws_2.10.3_ofi161.log",
        {
            "nccl_version": "2.10.3+cuda11.3",
            "network": "AWS Libfabric",
            "provider": "efa",
            "net_plugin": plugin(
                "aws-ofi-nccl", version="1.3.0aws", release="1.3.0aws", project="aws-ofi-nccl"
            ),
            "warnings": [],
            "errors": [],
        },
        id="aws-ofi-nccl-1.3-before-load-lines",
    ),
    pytest.param(
        "p2p_disabled_shm_gdr1_ring_vllm_2.28.9.log",
        {
            "nccl_version": "2.28.9+cuda13.0",
            "network": "Socket",
            "net_plugin": None,
            "net_plugin_error": "NET/Plugin: Could not find: libnccl-net.so",
            "gdr": None,
            "nvls": False,
            "nvls_used": False,
            "transports": ["SHM"],
            "environment": {"NCCL_CUMEM_ENABLE": "1", "NCCL_P2P_DISABLE": "1"},
            "warnings": [],
            "errors": [],
        },
        id="P2P-disabled-2.28-SHM-GDR1-ring-line",
    ),
    pytest.param(
        "p2p_cumem_socket_2.28.9.log",
        {"transports": ["P2P/CUMEM"], "gdr": None, "nvls_used": False, "errors": []},
        id="P2P-on-2.28-CUMEM",
    ),
    pytest.param(
        "nvls_used_gdrdma_2node_bracket_ts_k8s.log",
        {
            "network": "IB",
            "gdr": True,
            "nvls": True,
            "nvls_used": True,
            "transports": ["NET/IB/GDRDMA", "P2P/IPC", "NVLS"],
            "errors": [],
        },
        id="NVLS-used-2-nodes-GDRDMA",
    ),
]


@pytest.mark.parametrize(("name", "expected"), FACTS)
def test_recorded_log_states_these_facts(name: str, expected: dict[str, object]) -> None:
    """GPU behaviour: each row is the node or job its file records (SOURCES.md; the id names it), and the
    facts are what NCCL said there -- failures, plugin, network, GDR, transports, NVLS."""
    out = parse(name).to_json()
    assert {key: out[key] for key in expected} == expected


def test_gdr_1_on_the_ring_line_of_a_node_without_rdma_network_is_not_gdr() -> None:
    """GPU behaviour: NCCL 2.27+ prints ``Connected all rings, use ring PXN 0 GDR 1`` on a single-node
    job whose only network is sockets; GPUDirect RDMA is in use for no network path there."""
    for name in (
        "p2p_disabled_shm_gdr1_ring_vllm_2.28.9.log",
        "rdma_plugin_v6_tencent_socket_ras_warn_2.27.3.log",
    ):
        log = parse(name)
        assert any("GDR 1" in line for line in (LOGS / name).read_text().splitlines())
        assert log.gdr is None, name
        assert all(r.gdr is None for r in log.per_rank)


def test_gdr_is_quoted_from_the_gdrdma_channel_line() -> None:
    """GPU behaviour: two 8-GPU nodes whose IB channels use GPUDirect RDMA (``via NET/IB/0/GDRDMA``)."""
    log = parse("collnet_ignored_warn_gdrdma_p2p_read_nccl_tests133.log")
    assert log.gdr.evidence.line_no == 6
    assert log.gdr.evidence.text.endswith("[receive] via NET/IB/0/GDRDMA")


def test_p2p_disabled_run_used_no_p2p_or_nvls_connection() -> None:
    """GPU behaviour: the "without NVLink" side of the NVLink speedup (NCCL_P2P_DISABLE=1) on two GPUs
    with no NVSwitch: NCCL says P2P is disabled, sets up SHM channels only and no NVLS."""
    log = parse("p2p_disabled_shm_gdr1_ring_vllm_2.28.9.log")
    assert p2p_or_nvls_connections(log) == ()
    assert {c.transport for c in log.connections} == {"SHM"}
    env = {f.value: f.evidence.line_no for f in log.environment}
    assert env[("NCCL_P2P_DISABLE", "1")] == 22


def test_p2p_run_shows_its_p2p_channels_with_their_lines() -> None:
    """GPU behaviour: the same two GPUs with P2P on use ``P2P/CUMEM`` channels; a check that forbade P2P
    would quote these lines."""
    found = p2p_or_nvls_connections(parse("p2p_cumem_socket_2.28.9.log"))
    assert [(c.transport, c.channel, c.peers, c.evidence.line_no) for c in found] == [
        ("P2P/CUMEM", 0, (1, 0), 32),
        ("P2P/CUMEM", 1, (1, 0), 33),
    ]


def test_nvls_use_is_told_apart_from_nvls_support() -> None:
    """GPU behaviour: an NVSwitch node pair where NCCL set NVLS up (``NVLS comm``, ``Connected NVLS
    tree``, ``16 nvls channels``): NVLS counts as used, quoting the first such line, next to P2P/IPC
    and NET/IB/GDRDMA channels. A run that meant to avoid NVLink (P2P disabled) would be caught by the
    NVLS connections alone."""
    log = parse("nvls_used_gdrdma_2node_bracket_ts_k8s.log")
    assert log.nvls_used.value is True
    assert "NVLS comm 0x7efd4a7402a0" in log.nvls_used.evidence.text
    nvls = [c for c in p2p_or_nvls_connections(log) if c.family == "NVLS"]
    assert len(nvls) >= 3 and any(c.evidence.text.endswith("Connected NVLS tree") for c in nvls)
    assert {c.family for c in log.connections} == {"NET", "P2P", "NVLS"}
    # "NVLS multicast support is available" is not in this excerpt: support is inferred from the use.
    assert log.nvls.value is True


def test_zero_nvls_channels_is_nvls_not_used() -> None:
    log = parse("rdma_plugin_v5_p2p_direct_pointer_h800_nccl892.log")
    assert log.nvls_used.value is False
    assert log.nvls_used.evidence.text.endswith(
        "16 coll channels, 0 nvls channels, 16 p2p channels, 16 p2p channels per peer"
    )


def test_bracketed_timestamps_and_blank_lines_between_records() -> None:
    """GPU behaviour: a Kubernetes training job's log collector prefixing every NCCL record of eight
    GPU processes with ``[date time] ``."""
    log = parse("nvls_used_gdrdma_2node_bracket_ts_k8s.log")
    assert {r.host for r in log.per_rank} == {"t-20260428141043-cmz7n-worker-0"}
    # Device 6 only says "Connected all trees" in this excerpt: a source that states nothing is no rank.
    assert sorted(r.device for r in log.per_rank) == [0, 1, 2, 3, 4, 5, 7]
    assert log.per_rank[0].transports[0].evidence.text.startswith("[2026-04-28 14:14:49] t-20260428141043")


def test_records_glued_on_one_physical_line_are_split() -> None:
    """GPU behaviour: a console that lost line ends put five records of two ranks on one line, padded
    with spaces; each record is read on its own and quoted on its own."""
    log = parse("glued_lines_rdma_plugin_v6_deepep106.log")
    assert [r.key for r in log.per_rank] == [
        "VM-17-82-centos:11981[3]",
        "VM-17-82-centos:11982[4]",
        "VM-17-82-centos:11984[6]",
    ]
    rank3 = log.per_rank[0]
    assert rank3.net_plugin.value.name == "NCCL RDMA Plugin"
    assert rank3.net_plugin.evidence.text.strip() == (
        "VM-17-82-centos:11981:11981 [3] NCCL INFO NET/Plugin: Loaded net plugin NCCL RDMA Plugin v6 (v6)"
    )
    rank6 = log.per_rank[2]
    assert rank6.cuda_driver_version.value == 12040
    assert (
        rank6.cuda_driver_version.evidence.text
        == "VM-17-82-centos:11984:11984 [6] NCCL INFO cudaDriverVersion 12040"
    )
    # Rank 4's excerpt has the plugin path and release but not the load line: unknown name, not another one.
    assert log.to_json()["disagreements"] == []


def test_a_record_starting_mid_line_is_one_more_record_of_its_process() -> None:
    """GPU behaviour: two vLLM workers writing to one terminal; rank 1's first record starts in the
    middle of rank 0's half-written line (``...send 0.000proxmox:1495820:1495820 [1] NCCL INFO``)."""
    log = parse("p2p_disabled_shm_gdr1_ring_vllm_2.28.9.log")
    assert [r.key for r in log.per_rank] == ["proxmox:1495819[0]", "proxmox:1495820[1]"]
    rank1 = log.per_rank[1]
    assert (rank1.rank.value, rank1.nccl_version.evidence.line_no) == (1, 51)
    assert not any("0.000" in (r.host or "") for r in log.per_rank)


def test_a_cut_last_line_is_not_read() -> None:
    """GPU behaviour: a RoCE node's log pasted up to a half line: the verbs failure before it is kept."""
    log = parse("ibv_create_cq_roce_2.7.8_nccl380.log")  # ends "spark01:2683" with no line end
    assert max(f.evidence.line_no for f in log.errors) == 13


def test_cli_reports_warn_level_failures_under_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """``gpucluster parse nccl-log`` on a log whose only problem is a WARN-level failure."""
    code = main(["parse", "nccl-log", str(LOGS / "network_not_found_ofi_cscs_docs.log")])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["errors"] == ["Error: network AWS Libfabric not found."]
    assert out["warnings"] == []
    assert out["error_lines"][0].startswith("line 3: ")
