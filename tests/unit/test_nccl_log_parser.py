"""The NCCL_DEBUG=INFO parser on real logs (tests/data/nccl_logs, see SOURCES.md there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.nccl_log import NcclLog, disagreements, parse_nccl_log, to_json

LOGS = Path(__file__).resolve().parent.parent / "data" / "nccl_logs"
SEED_EFA = "efa_libfabric_aws_ofi_2.27.3.log"


def read(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def parse(name: str) -> NcclLog:
    return parse_nccl_log(read(name))


def test_efa_seed_log_gives_the_whole_json_object() -> None:
    assert parse(SEED_EFA).to_json() == {
        "nccl_version": "2.27.3+cuda12.9",
        "cuda_driver_version": 13000,
        "network": "Libfabric",
        "net_plugin": {
            "name": "Libfabric",
            "version": "1.16.2",
            "api": "v10",
            "library": "libnccl-net.so",
            "release": "1.16.2",
            "project": "aws-ofi-nccl",
        },
        "net_plugin_error": None,
        "provider": "efa",
        "gdr": False,
        "nvls": False,
        "nvls_used": False,
        "nranks": 16,
        "nnodes": 4,
        "local_ranks": 4,
        "transports": ["SHM", "NET/Libfabric"],
        "transport_lines": {
            "SHM": "line 345: llama-3-8b-node-0-0:193:1176 [2] NCCL INFO Channel 00 : 2[2] -> 3[3] via SHM/direct/direct",
            "NET/Libfabric": "line 351: llama-3-8b-node-0-0:194:1177 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[0] "
            "[send] via NET/Libfabric/0",
        },
        "interfaces": ["eth0", "rdmap49s0"],
        "link_layers": [],
        "environment": {"NCCL_SOCKET_IFNAME": "^docker0,lo", "NCCL_PROTO": "simple"},
        "warnings": [],
        "errors": [],
        "error_lines": [],
        "disagreements": [],
    }


def test_to_json_is_one_serialisable_object() -> None:
    paths = sorted(LOGS.glob("*.log"))
    assert len(paths) >= 8
    for path in paths:
        log = parse_nccl_log(path.read_text(encoding="utf-8"))
        out = json.loads(json.dumps(to_json(log)))
        assert out == log.to_json(), path.name


def test_each_fact_quotes_the_line_it_came_from() -> None:
    log = parse(SEED_EFA)
    assert log.network.evidence.line_no == 81
    assert log.network.evidence.text.endswith("NCCL INFO Using network Libfabric")
    assert str(log.net_plugin.evidence) == (
        "line 17: llama-3-8b-node-0-0:194:724 [3] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v10)"
    )
    assert "disabling GDR" in log.gdr.evidence.text
    assert "NVLS multicast support is not available" in log.nvls.evidence.text
    lines = read(SEED_EFA).splitlines()
    for fact in (log.nccl_version, log.cuda_driver_version, log.provider, log.nranks, *log.transports):
        assert lines[fact.evidence.line_no - 1] == fact.evidence.text


def test_efa_seed_keeps_one_record_per_rank() -> None:
    log = parse(SEED_EFA)
    assert [r.rank.value for r in log.per_rank] == [0, 1, 2, 3]
    assert [r.key for r in log.per_rank] == [f"llama-3-8b-node-0-0:{191 + i}[{i}]" for i in range(4)]
    for rank in log.per_rank:
        assert rank.network.value == "Libfabric"
        assert rank.net_plugin.value.version == "1.16.2"
        assert rank.provider.value == "efa"
        assert rank.nranks.value == 16
    assert log.unattributed is None
    assert disagreements(log) == []


def test_a_rank_on_another_network_is_named_with_its_line() -> None:
    # The seed log as recorded, with rank 1's "Using network" line (line 138) changed to sockets.
    lines = read(SEED_EFA).splitlines()
    assert lines[137] == "llama-3-8b-node-0-0:192:725 [1] NCCL INFO Using network Libfabric"
    lines[137] = "llama-3-8b-node-0-0:192:725 [1] NCCL INFO Using network Socket"
    log = parse_nccl_log("\n".join(lines))

    [found] = disagreements(log)
    assert (found.fact, found.majority, found.majority_count) == ("network", "Libfabric", 3)
    [(rank, fact)] = found.odd
    assert (rank.rank.value, fact.value, fact.evidence.line_no) == (1, "Socket", 138)
    assert "rank 1 (llama-3-8b-node-0-0:192[1]) says 'Socket' (line 138: " in str(found)
    assert log.network.value == "Libfabric"
    assert log.to_json()["disagreements"] == [str(found)]


def test_a_rank_on_another_nccl_version_is_named() -> None:
    lines = read(SEED_EFA).splitlines()
    assert lines[7] == "llama-3-8b-node-0-0:194:194 [3] NCCL INFO NCCL version 2.27.3+cuda12.9"
    lines[7] = "llama-3-8b-node-0-0:194:194 [3] NCCL INFO NCCL version 2.21.5+cuda12.4"
    [found] = disagreements(parse_nccl_log("\n".join(lines)))
    assert found.fact == "nccl_version"
    assert [(r.rank.value, f.value) for r, f in found.odd] == [(3, "2.21.5+cuda12.4")]


# One row per recorded log: the facts that log states, as to_json gives them.
FACTS = [
    pytest.param(
        "ib_gdrdma_2.7.6_nccl707.log",
        {
            "nccl_version": "2.7.6+cuda11.1",
            "network": "IB",
            "net_plugin": None,
            "net_plugin_error": "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
            "gdr": True,
            "transports": ["NET/IB/GDRDMA"],
            "link_layers": ["IB", "RoCE"],
        },
        id="IB-GDRDMA",
    ),
    pytest.param(
        "roce_2.19.3_nccl_tests185.log",
        {
            "nccl_version": "2.19.3+cuda12.3",
            "cuda_driver_version": 12000,
            "network": "IB",
            "net_plugin": None,
            "interfaces": ["enp220s0np0", "mlx5_10:1", "mlx5_11:1"],
            "link_layers": ["RoCE"],
            "warnings": [],
        },
        id="RoCE",
    ),
    pytest.param(
        "roce_ibext_disabled_nccl676.log",
        {
            "network": "IB",
            "net_plugin": {
                "name": "nccl-rdma-sharp-plugins",
                "version": None,
                "api": None,
                "library": "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
                "release": None,
                "project": "nccl-rdma-sharp-plugins",
            },
            "interfaces": ["enp225s0f1", "mlx5_9:1"],
            "link_layers": ["RoCE"],
        },
        id="RoCE-hpcx-plugin",
    ),
    pytest.param(
        "socket_forced_2.11.4_nccl676.log",
        {"nccl_version": "2.11.4+cuda11.4", "network": "Socket", "interfaces": ["enp225s0f1"]},
        id="socket-forced",
    ),
    pytest.param(
        "socket_no_ibverbs_2.4.8_nccl259.log",
        {
            "nccl_version": "2.4.8+cuda10.1",
            "network": "Socket",
            "net_plugin_error": "NET/Plugin : No plugin found (libnccl-net.so).",
            "nranks": 8,
            "warnings": ["Failed to open libibverbs.so[.1]"],
        },
        id="socket-no-ibverbs",
    ),
    pytest.param(
        "socket_openmpi_lo_2.5.6_nccl300.log",
        {"nccl_version": "2.5.6+cuda10.2", "network": "Socket", "interfaces": ["lo"]},
        id="socket-openmpi-prefix",
    ),
    pytest.param(
        "socket_fallback_ibext_warn_nccl952.log",
        {
            "cuda_driver_version": 12010,
            "network": "Socket",
            "net_plugin": {
                "name": "nccl-rdma-sharp-plugins",
                "version": None,
                "api": None,
                "library": "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
                "release": None,
                "project": "nccl-rdma-sharp-plugins",
            },
            "gdr": False,
            "nvls": False,
            "nranks": 16,
            "transports": ["P2P/IPC", "NET/Socket"],
            "interfaces": ["ibp12s0"],
            "warnings": [],
            "errors": [
                "[Service thread] Error encountered progressing operation=Connect, res=2, closing connection",
                "[Proxy Service 11] Failed to execute operation Connect from rank 11, retcode 2",
                "socketProgress: Connection closed by remote peer <cluster_name>.ibnet<53735>",
            ],
        },
        id="socket-fallback-with-WARN",
    ),
    pytest.param(
        "plugin_missing_socket_2.21.5_nccl1653.log",
        {
            "nccl_version": "2.21.5+cuda12.4",
            "cuda_driver_version": 12040,
            "network": "Socket",
            "net_plugin": None,
            "net_plugin_error": "NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared "
            "object file: No such file or directory : when loading libnccl-net.so",
            "nranks": 1,
            "nnodes": 1,
            "local_ranks": 1,
        },
        id="plugin-load-failed",
    ),
    pytest.param(
        "plugin_missing_pdsh_prefix_nccl1059.log",
        {
            "cuda_driver_version": 12030,
            "network": None,
            "net_plugin": None,
            "net_plugin_error": "NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: "
            "cannot open shared object file: No such file or directory",
            "interfaces": ["ibP257s464513", "ibP257s452603"],
        },
        id="plugin-load-failed-pdsh-prefix",
    ),
    pytest.param(
        "nvls_ibext_sharp_2.24.3_nccl1584_stripped.log",
        {
            "nccl_version": "2.24.3+cuda12.2",
            "cuda_driver_version": 12040,
            "network": "IBext_v8",
            "net_plugin": {
                "name": "NCCL RDMA Plugin",
                "version": "v8",
                "api": "v8",
                "library": "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
                "release": None,
                "project": "nccl-rdma-sharp-plugins",
            },
            "nvls": True,
            "nranks": 8,
            "nnodes": 1,
            "local_ranks": 8,
            "link_layers": ["IB"],
        },
        id="NVLS-no-prefix-at-all",
    ),
    pytest.param(
        "nvls_ibext_sharp_2.24.3_nccl1584_info.log",
        {"nccl_version": "2.24.3+cuda12.2", "network": "IBext_v8", "nranks": 8, "nvls": None},
        id="NCCL-INFO-prefix-only",
    ),
    pytest.param(
        "efa_openmpi_aws_libfabric_ofi24.log",
        {
            "network": "AWS Libfabric",
            "gdr": False,
            "transports": ["P2P/IPC", "NET/AWS Libfabric"],
            "warnings": [],
            "errors": ["NET/OFI Couldn't open AV. RC: -22, ERROR: Invalid argument"],
        },
        id="EFA-old-openmpi-WARN",
    ),
    pytest.param(
        "efa_cloudwatch_2.21.5_ofi889.log",
        {
            "nccl_version": "2.21.5+cuda12.8",
            "cuda_driver_version": 12040,
            "net_plugin_error": None,
            "interfaces": ["eth0"],
            "warnings": [],
        },
        id="cloudwatch-table",
    ),
    pytest.param(
        "cloudwatch_ts_lines_p2p_cumem_ofi715.log",
        {"nvls": False, "transports": ["P2P/CUMEM"], "gdr": None},
        id="cloudwatch-timestamp-lines",
    ),
    pytest.param(
        "ib_roce_rankprefix_2.5.6_nccl302.log",
        {"network": "IB", "transports": ["P2P/IPC"], "link_layers": ["IB", "RoCE"]},
        id="rank-label-prefix",
    ),
    pytest.param(
        "ib_internal_2.3.7_nccl179.log",
        {
            "nccl_version": "2.3.7+cuda9.0",
            "network": "IB",
            "nranks": 8,
            "interfaces": ["enp1s0f0", "mlx5_1:1", "mlx5_3:1", "mlx5_0:1", "mlx5_2:1"],
        },
        id="NCCL-2.3",
    ),
    pytest.param(
        "collnet_sharp_warn_nccl1219.log",
        {
            "transports": ["CollNet/SHARP/GDRDMA"],
            "gdr": True,
            "interfaces": ["mlx5_4:1"],
            "warnings": [],
            "errors": ["SHARP group create: Streaming Tree lock failed (-18)"],
        },
        id="CollNet-SHARP-WARN",
    ),
    pytest.param(
        "ib_warn_completion_nccl1405.log",
        {
            "warnings": [],
            "errors": [
                "NET/IB : Got completion from peer 10.216.210.236<54862> with status=12 opcode=0 len=0 vendor "
                "err 129 (Recv) localGid fd00:1148:9000:5000:4:200:3:ff22 remoteGidsfd00:1148:9000:5000:4:200:3:ff1f",
                "NET/IB : Got completion from peer 10.216.210.236<54862> with status=12 opcode=32616 len=0 vendor "
                "err 129 (Recv) localGid fd00:1148:9000:5000:4:200:3:ff21 remoteGidsfd00:1148:9000:5000:4:200:3:ff20",
                "NET/IB : Got completion from peer 10.216.210.236<49892> with status=12 opcode=32616 len=0 vendor "
                "err 129 (Recv) localGid fd00:1148:9000:5000:4:200:3:ff22 remoteGidsfd00:1148:9000:5000:4:200:3:ff1f",
            ],
        },
        id="IB-completion-WARN",
    ),
    pytest.param(
        "old_2.0_warn_nccl111.log",
        {
            "warnings": [],
            "errors": [
                "Call to connect failed : Connection refused",
                "NCCL failure *MyProgram*.cu:110 'unhandled system error'",
            ],
        },
        id="NCCL-2.0-WARN-without-NCCL-word",
    ),
]


@pytest.mark.parametrize(("name", "expected"), FACTS)
def test_recorded_log_states_these_facts(name: str, expected: dict[str, object]) -> None:
    out = parse(name).to_json()
    assert {key: out[key] for key in expected} == expected


def test_warn_keeps_where_nccl_printed_it_and_which_rank() -> None:
    log = parse("socket_fallback_ibext_warn_nccl952.log")
    assert [e.note for e in log.errors] == ["proxy.cc:1485", "proxy.cc:1519", "misc/socket.cc:49"]
    [rank11] = [r for r in log.per_rank if r.rank and r.rank.value == 11]
    assert rank11.key == "<cluster_name>:922[3]"
    assert len(rank11.errors) == 3


def test_one_process_driving_several_gpus_gives_one_record_per_device() -> None:
    log = parse("ib_gdrdma_2.7.6_nccl707.log")  # nccl-tests -g 4: one pid, devices 0-3
    assert [r.key for r in log.per_rank] == [f"10-90-43-152:120890[{d}]" for d in range(4)]
    assert [r.network.note for r in log.per_rank] == ["", *["from the channel lines"] * 3]
    assert log.network.note == ""  # the stated line wins over channel inference
    # "NCCL version" is printed without a prefix, so it belongs to no rank.
    assert log.unattributed.nccl_version.value == "2.7.6+cuda11.1"
    assert disagreements(log) == []


@pytest.mark.parametrize(
    ("name", "hosts"),
    [
        ("efa_cloudwatch_2.21.5_ofi889.log", {"ip-10-36-29-253"}),
        ("socket_openmpi_lo_2.5.6_nccl300.log", {"5873af64cf59"}),
        ("plugin_missing_pdsh_prefix_nccl1059.log", {"MLVM", "MLVM2"}),
        ("ib_roce_rankprefix_2.5.6_nccl302.log", {"crow-ib-new-nccl-256-info-19"}),
        ("cloudwatch_ts_lines_p2p_cumem_ofi715.log", {"algo-1"}),
        (
            "efa_openmpi_aws_libfabric_ofi24.log",
            {"ip-172-32-36-209", "ip-172-32-38-1", "ip-172-32-34-121", "ip-172-32-45-165"},
        ),
    ],
)
def test_launcher_and_collector_prefixes_do_not_leak_into_host_names(name: str, hosts: set[str]) -> None:
    assert {r.host for r in parse(name).per_rank} == hosts


def test_openmpi_warning_is_attributed_to_the_rank_that_printed_it() -> None:
    [error] = parse("efa_openmpi_aws_libfabric_ofi24.log").errors
    assert error.note == "create_nccl_ofi_component:459"
    assert error.evidence.text.startswith("[1,23]<stdout>:ip-172-32-45-165:72593:73427 [7]")


def test_a_log_stripped_of_every_prefix_has_facts_but_no_ranks() -> None:
    log = parse("nvls_ibext_sharp_2.24.3_nccl1584_stripped.log")
    assert log.per_rank == ()
    assert log.unattributed.nvls.evidence.text == "NVLS multicast support is available on dev 0"


def test_other_tools_info_and_error_lines_are_not_nccl_lines() -> None:
    # SHARP's own "[node:0:174 - comm.c:379][...] ERROR ..." and Python logging's "46393 INFO" lines.
    collnet = parse("collnet_sharp_warn_nccl1219.log")  # its one error is NCCL's WARN, not SHARP's ERROR
    assert [e.evidence.line_no for e in collnet.errors] == [8] and collnet.nccl_lines == 4
    old = parse("ib_internal_2.3.7_nccl179.log")
    cited = {f.evidence.line_no for r in old.per_rank for f in (*r.interfaces, *r.transports)}
    assert 1 not in cited and old.nccl_lines == 15


def test_a_log_cut_anywhere_parses_or_says_it_holds_no_nccl_line() -> None:
    text = read(SEED_EFA)
    for cut in range(0, len(text), 997):
        try:
            out = parse_nccl_log(text[:cut]).to_json()
        except ParseError:
            assert "NCCL" not in text[:cut]
            continue
        assert out["nccl_version"] in (None, "2.27.3+cuda12.9")
        assert out["network"] in (None, "Libfabric")
        assert out["disagreements"] == []


@pytest.mark.parametrize(
    "text",
    [
        "",
        # DeepSpeed's own output from the seed-003 job, with no NCCL line in it.
        "Stage 3 initialize beginning\nMA 14.96 GB         Max_MA 14.96 GB         CA 15.08 GB         Max_CA 15 GB \n"
        "DeepSpeedZeRoOffload initialize [begin]\nUsing auto half precision backend\n",
    ],
    ids=["empty", "no-nccl-lines"],
)
def test_text_without_any_nccl_line_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError, match="NCCL_DEBUG=INFO"):
        parse_nccl_log(text)
