"""The fabric-wide IB parsers on real public outputs (tests/data/infiniband/SOURCES.md) and on the
real tools' outputs recorded against ibsim, plus cut and prefixed variants; the judges on models
built from generated topologies (pure: no simulator here)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_gpucluster.checks.ib_fabric import (
    judge_counters,
    judge_links,
    judge_rails,
    judge_shape,
    judge_sm,
    judge_topology,
)
from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.ib_fabric import (
    FabricModel,
    build_fabric,
    parse_iblinkinfo,
    parse_ibnetdiscover,
    parse_ibqueryerrors,
    parse_sminfo,
    speed_name,
)
from pytest_gpucluster.testbed.ib_topology import TopologySpec, generate

DATA = Path(__file__).resolve().parents[1] / "data" / "infiniband"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_superbench_hdr_ibnetdiscover_nodes_links_and_hca_descriptions() -> None:
    nodes, links, port_guids = parse_ibnetdiscover(read("ibnetdiscover_hdr_faked_superbench.txt"))
    switches = [n for n in nodes.values() if n.kind == "switch"]
    cas = [n for n in nodes.values() if n.kind == "ca"]
    assert len(switches) == 8 and len(cas) == 10
    host = nodes["0x0ff08c4321664e96"]
    assert (host.host, host.device, host.lid) == ("RMD701091901003", "ibp11s0f0", 1181)
    spine = nodes["0x0ff08c43213b3f30"]
    assert spine.description == "MF0;rmd70-0101-0908-01ib1-A:MCS8500/S01/U1" and spine.lid == 387
    # every cable once, at 4X HDR, though most appear from both ends
    assert len(links) == 18 and {(x.width, x.speed) for x in links} == {(4, "HDR")}
    assert {("0x0ff08c4321664e96", 1), ("0x0ff08c43215bae48", 1)} in [{x.a, x.b} for x in links]
    assert port_guids["0x0ff08c4321664e96"] == "0x0ff08c4321664e96"


def test_gcm_switch_lines_only() -> None:
    nodes, links, _ = parse_ibnetdiscover(read("ibnetdiscover_switch_lines_gcm.txt"))
    assert [(n.description, n.lid, n.ports) for n in nodes.values()] == [
        ("switch0001", 1433, 41),
        ("switch0002", 1434, 41),
    ]
    assert links == ()


def test_ibnetdiscover_cut_mid_record_keeps_what_was_read() -> None:
    text = read("ibnetdiscover_hdr_faked_superbench.txt")
    cut = text[: text.index('Ca      1 "H-0ff08c43217299f2"') + 20]
    nodes, links, _ = parse_ibnetdiscover(cut)
    assert "0x0ff08c4321664e96" in nodes and len(links) == 18  # the switches already named every cable


def test_ibnetdiscover_without_nodes_says_what_it_expected() -> None:
    with pytest.raises(ParseError, match="no 'Switch N"):
        parse_ibnetdiscover("ibwarn: mad_rpc_open_port failed\n")
    with pytest.raises(ParseError, match="line 1: a port line before any"):
        parse_ibnetdiscover('[1]  "S-0000000000000001"[2]\n')


def test_hpl_edr_iblinkinfo_grepped_with_prompts() -> None:
    rows = parse_iblinkinfo(read("iblinkinfo_edr_grep_up_hpl_prompt.txt"))
    assert len(rows) == 6
    assert {(r.width, r.speed, r.state, r.phys) for r in rows} == {(4, "EDR", "Active", "LinkUp")}
    switch_rows = [r for r in rows if r.node is None]
    assert [(r.lid, r.port, r.peer_lid, r.peer_description) for r in switch_rows] == [
        (2, 17, 4, "n02 HCA-1"), (2, 18, 1, "n01 HCA-1"), (2, 36, 3, "mgt mlx5_0")]  # fmt: skip


def test_qdr_iblinkinfo_blocks_down_ports_and_pdsh_style_cut() -> None:
    text = read("iblinkinfo_qdr_ca_and_switch_blocks.txt")
    rows = parse_iblinkinfo(text)
    ca = rows[0]
    assert (ca.description, ca.lid, ca.port, ca.speed, ca.peer_port) == (
        "centos-data-200 HCA-1",
        4,
        1,
        "QDR",
        3,
    )
    down = [r for r in rows if r.state == "Down"]
    assert len(down) == 32 and {r.phys for r in down} == {"Polling"} and down[0].node == "0x0002c9020046c588"
    cut = parse_iblinkinfo(text[: text.index("2   20[")])
    assert len(cut) == len(rows) - 17


def test_ibsim_outputs_build_one_model() -> None:
    model = build_fabric(
        read("ibsim_8x2_faults_ibnetdiscover.txt"),
        read("ibsim_8x2_faults_iblinkinfo_line.txt"),
        read("ibsim_8x2_faults_ibqueryerrors.txt"),
        read("ibsim_sminfo_master.txt"),
    )
    assert sum(n.kind == "switch" for n in model.nodes.values()) == 6
    assert sum(n.kind == "ca" for n in model.nodes.values()) == 15  # gpu-node-005 mlx5_0 has no cable
    assert model.sm is not None and model.sm.state == "SMINFO_MASTER"
    narrow = [x for x in model.links if x.width == 1]
    assert [model.label(e[0]) for x in narrow for e in (x.a, x.b)] == ["gpu-node-003 mlx5_1", "leaf-r1-01"]
    leaf = next(k for k, n in model.nodes.items() if n.description == "leaf-r1-01")
    hca = next(k for k, n in model.nodes.items() if n.description == "gpu-node-002 mlx5_0")
    assert model.counters[leaf, 3] == {"symbol_error": 500}
    assert model.counters[hca, 1] == {"link_downed": 255}  # listed by port GUID, mapped to its node
    assert ("Down", "Polling") in model.port_states.values()
    # the default iblinkinfo blocks give the same port states
    blocks = build_fabric(read("ibsim_8x2_faults_ibnetdiscover.txt"), read("ibsim_8x2_faults_iblinkinfo.txt"))
    assert blocks.port_states == model.port_states
    assert FabricModel.from_json(model.to_json()) == model


def test_ibqueryerrors_and_sminfo_bad_input() -> None:
    assert parse_ibqueryerrors("## Summary: 4 nodes checked, 0 bad nodes found\n") == {}
    with pytest.raises(ParseError, match="neither"):
        parse_ibqueryerrors("Query SA failed\n")
    with pytest.raises(ParseError, match="names no SM"):
        parse_sminfo("sminfo: iberror: failed: query\n")


@pytest.mark.parametrize(
    ("text", "name"), [("2.5", "SDR"), ("25.78125 Gbps", "EDR"), ("HDR", "HDR"), ("7", "7 Gbps")]
)
def test_speed_names(text: str, name: str) -> None:
    assert speed_name(text) == name


def _model(spec: TopologySpec) -> FabricModel:
    return build_fabric(generate(spec).text())


def test_judges_on_generated_topologies() -> None:
    golden = _model(TopologySpec(nodes=8, rails=2))
    assert judge_links(golden) == [] and judge_shape(golden, 2) == [] and judge_rails(golden) == []
    assert judge_topology(golden, golden) == []
    uplink = _model(TopologySpec(nodes=8, rails=2, missing=(("leaf-r1-02", 5),)))
    (leaf,) = judge_shape(uplink)
    assert leaf.where == "leaf-r1-02" and "1 uplinks, 3 of 4 leaves have 2" in leaf.detail
    (moved_a, moved_b) = judge_topology(
        _model(TopologySpec(nodes=8, rails=2, swap_rails=((1, 0, 1),))), golden
    )
    assert moved_a.line().startswith(
        "gpu-node-002 mlx5_0 (rail 0) <-> leaf-r1-01 port 2: the golden topology has"
    )
    assert moved_a.action == "move the cable back to leaf-r0-01 port 2" and moved_b.kind == "moved-cable"
    fat = _model(TopologySpec(nodes=8, rails=2, rail_optimized=False))
    assert judge_links(fat) == [] and judge_shape(fat) == []
    (sm,) = judge_sm(golden)
    assert sm.kind == "subnet-manager" and sm.rung == "rerun"


def test_counter_judge_classes_allowances_and_resets() -> None:
    base = _model(TopologySpec(nodes=4, rails=1))
    leaf = "leaf-r0-01"

    def with_counters(counters: dict[tuple[str, int], dict[str, int]]) -> FabricModel:
        return FabricModel(base.nodes, base.links, {}, counters)

    before = with_counters({(leaf, 1): {"symbol_error": 3}})
    assert judge_counters(before, before) == []
    grew = with_counters({(leaf, 1): {"symbol_error": 503}, (leaf, 2): {"port_xmit_discards": 9}})
    (finding,) = judge_counters(before, grew)  # discards are drop-class: recorded, not judged by default
    assert finding.line() == (
        "leaf-r0-01 port 1 <-> gpu-node-001 mlx5_0 (rail 0): SymbolErrorCounter +500 (3 -> 503, allowed 0) "
        "-> replace cable"
    )
    assert judge_counters(before, grew, allowed_increase={"symbol_error": 500}) == []
    assert [f.detail.split()[0] for f in judge_counters(before, grew, max_drop_increase=0)] == [
        "SymbolErrorCounter", "PortXmitDiscards"]  # fmt: skip
    reset = with_counters({(leaf, 1): {"symbol_error": 1}})
    assert [f.kind for f in judge_counters(before, reset)] == ["counter-reset"]
    pinned = with_counters({("gpu-node-002 mlx5_0", 1): {"link_downed": 255}})
    (sat,) = judge_counters(pinned, pinned)
    assert sat.kind == "counter-saturated" and sat.where.startswith(
        "gpu-node-002 mlx5_0 (rail 0) <-> leaf-r0-01 port 2"
    )
    assert judge_counters(pinned, pinned, saturated="warn") == []


def test_slow_pairs_localized_to_the_element_they_all_cross() -> None:
    from itertools import combinations

    from pytest_gpucluster.checks.ib_localize import PairOutcome, localize_on_fabric

    # 16 nodes x 2 rails, 4 nodes per leaf: rail r's leaves leaf-r<r>-01..04, two spines
    model = _model(TopologySpec(nodes=16, rails=2, nodes_per_leaf=4))
    hosts = [f"gpu-node-{i:03d}" for i in range(1, 17)]
    under_01 = set(hosts[:4])

    def pairs(slow: Callable[[str, str, int], bool]) -> list[PairOutcome]:
        return [PairOutcome(a, b, r, slow(a, b, r)) for a, b in combinations(hosts, 2) for r in (0, 1)]

    # rail-1 traffic leaving leaf-r1-01 is slow: its uplinks, not any node
    verdict = localize_on_fabric(model, pairs(lambda a, b, r: r == 1 and (a in under_01) != (b in under_01)))
    assert verdict is not None and verdict.element == "leaf leaf-r1-01 uplinks" and verdict.fast == 0
    # every rail-0 pair is slow: the rail
    verdict = localize_on_fabric(model, pairs(lambda a, b, r: r == 0))
    assert verdict is not None and verdict.element == "rail 0"
    # every pair with gpu-node-009 is slow: the node, the fabric is not to blame
    verdict = localize_on_fabric(model, pairs(lambda a, b, r: "gpu-node-009" in (a, b)))
    assert verdict is not None and verdict.element == "host gpu-node-009"
    assert verdict.line().endswith("the fabric is not to blame")
    # scattered slow pairs: nothing explains them all
    assert (
        localize_on_fabric(
            model, pairs(lambda a, b, r: (a, b, r) in {(hosts[0], hosts[5], 0), (hosts[9], hosts[14], 1)})
        )
        is None
    )


def test_slow_pairs_through_the_only_spine() -> None:
    from itertools import combinations

    from pytest_gpucluster.checks.ib_localize import PairOutcome, localize_on_fabric

    model = _model(TopologySpec(nodes=8, rails=1, nodes_per_leaf=2, spines=1))
    hosts = [f"gpu-node-{i:03d}" for i in range(1, 9)]
    leaf = {h: i // 2 for i, h in enumerate(hosts)}
    outcomes = [PairOutcome(a, b, 0, leaf[a] != leaf[b]) for a, b in combinations(hosts, 2)]
    verdict = localize_on_fabric(model, outcomes)
    assert verdict is not None and (verdict.element, verdict.slow, verdict.fast) == ("spine spine-01", 24, 0)


def test_pdsh_prefixed_outputs_parse_alike() -> None:
    """The same tools run through pdsh/clush: every line starts ``login01: ``."""

    def prefixed(name: str) -> str:
        return "".join(f"login01: {line}\n" for line in read(name).splitlines())

    plain = build_fabric(read("ibsim_8x2_faults_ibnetdiscover.txt"), read("ibsim_8x2_faults_iblinkinfo.txt"),
                         read("ibsim_8x2_faults_ibqueryerrors.txt"), read("ibsim_sminfo_master.txt"))  # fmt: skip
    again = build_fabric(prefixed("ibsim_8x2_faults_ibnetdiscover.txt"), prefixed("ibsim_8x2_faults_iblinkinfo.txt"),
                         prefixed("ibsim_8x2_faults_ibqueryerrors.txt"), prefixed("ibsim_sminfo_master.txt"))  # fmt: skip
    assert again == plain
    assert parse_iblinkinfo(prefixed("iblinkinfo_qdr_ca_and_switch_blocks.txt")) == parse_iblinkinfo(
        read("iblinkinfo_qdr_ca_and_switch_blocks.txt")
    )
    assert parse_ibnetdiscover(prefixed("ibnetdiscover_hdr_faked_superbench.txt")) == parse_ibnetdiscover(
        read("ibnetdiscover_hdr_faked_superbench.txt")
    )


def test_profile_fabric_ib_section(tmp_path: Path) -> None:
    from pytest_gpucluster.errors import ProfileError
    from pytest_gpucluster.fabric_scan import settings_from_profile

    profile = tmp_path / "site.yaml"
    profile.write_text(
        "extends: cpu-local\nname: site\nfabric:\n  allowed_increase: {symbol_error: 10}\n"
        "  ib: {link_width: 4, link_speed: ndr, rails: 8, topology: rail-optimized}\n"
    )
    settings = settings_from_profile(str(profile))
    assert (settings.link_width, settings.link_speed, settings.rails, settings.rail_optimized) == (
        4,
        "NDR",
        8,
        True,
    )
    assert settings.allowed_increase["symbol_error"] == 10  # merged over cpu-local's allowances
    profile.write_text("extends: cpu-local\nname: site\nfabric:\n  ib: {link_speed: 400G}\n")
    with pytest.raises(ProfileError, match="not an IBTA lane speed"):
        settings_from_profile(str(profile))


def test_fabric_localize_command_on_a_runs_pairs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``gpucluster fabric localize``: a recorded run's results.json with its pairs replaced by pairs on a
    generated fabric, where every pair leaving leaf-r0-01 (or -r1-01) ran at a third of the others."""
    import json
    from itertools import combinations

    from pytest_gpucluster.cli import main
    from pytest_gpucluster.results.model import Check, Measurement

    model = _model(TopologySpec(nodes=16, rails=2, nodes_per_leaf=4))
    (tmp_path / "fabric.json").write_text(json.dumps({"model": model.to_json(), "findings": []}))
    hosts = [f"gpu-node-{i:03d}" for i in range(1, 17)]
    under = set(hosts[:4])
    run = json.loads((DATA.parents[0] / "results" / "cpu_local_run.json").read_text())
    run["measurements"] = [
        Measurement.of(
            Check("burnin.pair_busbw", 4e9 if (a in under) != (b in under) else 12e9, "B/s", scope="inter-node",
                  labels={"pair": f"{a}<->{b}", "round": 1}),
            test_id="acceptance/test_burnin.py::test_pairwise", time=0.0,
        ).to_json()
        for a, b in combinations(hosts, 2)
    ]  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(run))
    code = main(
        ["fabric", "localize", str(tmp_path / "results.json"), "--fabric", str(tmp_path / "fabric.json")]
    )
    out = capsys.readouterr().out.splitlines()
    assert (
        code == 1 and out[0] == "fabric localize: 120 pair(s) in round 1, 48 slow (below 90% of the median)"
    )
    # the pairs used both rails: both leaves under the four nodes explain them; the first by name is reported
    assert (
        out[1]
        == "  leaf leaf-r0-01 uplinks: all 48 slow pairs cross it, 0 passing pair(s) do -> check leaf-r0-01's uplinks "
        "(its cables, transceivers and ports to the spines)"
    )


def test_nccl_tests_71_iblinkinfo_roce_mqm8700_with_sharp_node() -> None:
    """NVIDIA/nccl-tests issue 71's iblinkinfo: four V100 hosts at 4X EDR and a SHARP aggregation node
    at 4X HDR on one MQM8700; the author elided ports with ``...`` and the copy ends mid-line."""
    text = read("iblinkinfo_edr_hdr_mqm8700_sharp_cut_nccltests71.txt")
    rows = parse_iblinkinfo(text)
    switch = "MF0;ibswitch254:MQM8700/U1"
    assert [(r.description, r.lid, r.speed) for r in rows if r.description != switch] == [
        ("gpu-v100-3 HCA-1", 6, "EDR"), ("Mellanox Technologies Aggregation Node", 4, "HDR"),
        ("gpu-v100-1 HCA-1", 2, "EDR"), ("gpu-v100-0 HCA-1", 1, "EDR")]  # fmt: skip
    ports = [r for r in rows if r.description == switch]
    # the switch block's port lines carry no GUID: the block's; the cut port-41 line is not a row
    assert {r.node for r in ports} == {"0x0c42a10300b95bfa"}
    assert [(r.port, r.peer_lid, r.peer_description) for r in ports] == [
        (1, 1, "gpu-v100-0 HCA-1"), (2, 2, "gpu-v100-1 HCA-1"), (3, 6, "gpu-v100-3 HCA-1"),
        (4, 5, "gpu-v100-2 HCA-1")]  # fmt: skip
    assert {(r.width, r.state, r.phys) for r in rows} == {(4, "Active", "LinkUp")}
    # pdsh/clush-prefixed, and cut after the CA blocks: the same rows, fewer
    prefixed = "".join(f"gpu-v100-0: {line}\n" for line in text.splitlines())
    assert parse_iblinkinfo(prefixed) == rows
    assert parse_iblinkinfo(text[: text.index("Switch:")]) == rows[:4]
    with pytest.raises(ParseError, match="no '<lid> <port>"):
        parse_iblinkinfo(text[: text.index("0xb88303ffff7f61c4") + 30])
