"""What changed on the nodes between two runs (results/node_diff.py, through environment_diff), and
where the probe reads it (workloads/fabric_probe.read_links).

Stands for: an InfiniBand port back at half rate after a reboot, an Ethernet link that negotiated
down, a shaper left on an interface — the regression report must name them, not say "nothing
changed". The qdisc JSON is what ``tc -j qdisc show`` printed on this machine (iproute2 6.1) for
``tbf rate 70mbit`` and for an unshaped veth."""

from __future__ import annotations

from pathlib import Path

from pytest_gpucluster.cluster.node_facts import NetLink, NodeFacts
from pytest_gpucluster.results.baseline import RunResults, environment_diff
from pytest_gpucluster.results.node_diff import node_changes
from pytest_gpucluster.workloads.fabric_probe import _shaped_rate, read_links

TBF_70MBIT = '[{"kind":"tbf","handle":"8095:","root":true,"refcnt":3,"options":{"rate":8750000,"burst":32760,"lat":50000}}]'
NOQUEUE = '[{"kind":"noqueue","handle":"0:","root":true,"refcnt":2,"options":{}}]'


def node(host: str, *, shaped: int | None = None, speed: int | None = None, ib_rate: float = 400.0) -> dict:
    facts = NodeFacts(host, links=(NetLink("eth0", "up", speed, shaped),))
    data = facts.to_json()
    data["ib_ports"] = [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": ib_rate}]
    return data


def run(nodes: list[dict]) -> RunResults:
    return RunResults.from_json(
        {"schema_version": 2, "measurements": [], "nodes": {"source": "probe job", "nodes": nodes}}, "x"
    )


def test_the_root_qdiscs_rate_is_read_from_tc_json():
    assert _shaped_rate(TBF_70MBIT) == 8_750_000  # bytes/s: 70 Mbit/s
    assert _shaped_rate(NOQUEUE) is None and _shaped_rate("[]") is None and _shaped_rate("not json") is None


def test_a_shaped_link_a_slower_port_and_a_downshifted_nic_are_named_per_host():
    before = run([node("n0", shaped=12_500_000, speed=100000), node("n1")])
    after = run([node("n0", shaped=8_750_000, speed=50000, ib_rate=200.0), node("n1")])
    changes = [str(c) for c in environment_diff(before, after)]
    assert changes == [
        "n0 eth0 speed 100000 Mb/s -> 50000 Mb/s",
        "n0 eth0 shaped to 100 Mbit/s -> 70 Mbit/s",
        "n0 mlx5_0 port 1 rate 400 Gb/s -> 200 Gb/s",
    ]


def test_the_same_links_say_nothing_and_an_older_baseline_without_links_says_nothing():
    assert node_changes([node("n0", shaped=1000)], [node("n0", shaped=1000)]) == []
    old = node("n0")
    old.pop("links")
    old.pop("ib_ports")
    assert node_changes([old], [node("n0", shaped=1000)]) == []


def test_a_port_gone_is_said_but_a_container_veth_coming_and_going_is_not():
    with_extra = node("n0")
    with_extra["links"].append(
        {"name": "veth12ab", "operstate": "up", "speed_mbps": None, "shaped_bytes_per_s": None}
    )
    without_port = node("n0")
    without_port["ib_ports"] = []
    without_port["links"].append({"name": "lo0", "operstate": "up"})
    assert node_changes([with_extra], [without_port]) == [("n0 mlx5_0 port 1", "present", "(gone)")]


def test_the_probe_reads_state_and_speed_of_every_link_but_lo(tmp_path: Path):
    for name, speed, state in (("lo", "0", "unknown"), ("eth0", "25000", "up"), ("veth1", "-1", "up")):
        folder = tmp_path / "class" / "net" / name
        folder.mkdir(parents=True)
        (folder / "speed").write_text(f"{speed}\n")
        (folder / "operstate").write_text(f"{state}\n")
    (tmp_path / "class" / "net" / "ib0").mkdir()  # no speed file (a link that is down)
    links = read_links(tmp_path, shaping=False)
    assert links == {
        # has_address: None where the probe reads a recorded tree, not this machine's addresses
        "eth0": {"operstate": "up", "speed_mbps": 25000, "shaped_bytes_per_s": None, "has_address": None},
        "ib0": {"operstate": None, "speed_mbps": None, "shaped_bytes_per_s": None, "has_address": None},
        "veth1": {"operstate": "up", "speed_mbps": None, "shaped_bytes_per_s": None, "has_address": None},
    }
