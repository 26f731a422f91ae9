"""Hostfile parsing, checking and writing (pure; one test touches tmp_path for read_hostfile)."""

from __future__ import annotations

import re

import pytest

from pytest_gpucluster.cluster.hostfile import (
    HostEntry,
    Hostfile,
    hostfile_from_hosts,
    hostfile_to_json,
    hostname_problem,
    parse_hostfile,
    read_hostfile,
    to_deepspeed,
    to_openmpi,
)
from pytest_gpucluster.errors import HostfileError


def entry(host, slots=None, max_slots=None, user=None, line=1):
    return HostEntry(host=host, slots=slots, max_slots=max_slots, user=user, line=line)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("worker-1 slots=4\n", [entry("worker-1", 4)], id="deepspeed"),
        pytest.param("node1 slots=8 max_slots=16\n", [entry("node1", 8, 16)], id="openmpi-max_slots"),
        pytest.param("node1 slots=8 max-slots=8\n", [entry("node1", 8, 8)], id="openmpi-max-slots"),
        pytest.param("node1:4\n", [entry("node1", 4)], id="host-colon-count"),
        pytest.param("node1\nnode2\n", [entry("node1"), entry("node2", line=2)], id="bare-hosts"),
        pytest.param("ubuntu@10.0.0.5 slots=8", [entry("10.0.0.5", 8, user="ubuntu")], id="user-at-ip"),
        pytest.param(
            "# cluster A\n\n   node1 slots=8   # the fast one\n\t\nnode2\tslots=8\n",
            [entry("node1", 8, line=3), entry("node2", 8, line=5)],
            id="comments-blank-lines-leading-space-tabs",
        ),
        pytest.param(
            "node1 slots=8\r\nnode2 slots=8\r\n", [entry("node1", 8), entry("node2", 8, line=2)], id="crlf"
        ),
        pytest.param(
            "gpu_rack1-n01.cluster.local slots=8", [entry("gpu_rack1-n01.cluster.local", 8)], id="fqdn"
        ),
        pytest.param("node1 slots=08", [entry("node1", 8)], id="leading-zero-count"),
    ],
)
def test_parse_good(text, expected):
    hostfile = parse_hostfile(text, source="hosts")
    assert list(hostfile.entries) == expected
    assert hostfile.hosts == tuple(e.host for e in expected)
    assert hostfile.source == "hosts"


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        pytest.param("node1 slots=8\nnode2 lots=8\n", "hosts:2", "unknown key 'lots'", id="lots-typo"),
        pytest.param("node2 lots=8\n", "hosts:1", "did you mean 'slots'", id="lots-typo-hint"),
        pytest.param(
            "node1 slots=0", "hosts:1", "slots must be a positive integer, got '0'", id="slots-zero"
        ),
        pytest.param("node1 slots=-2", "hosts:1", "got '-2'", id="slots-negative"),
        pytest.param("node1 slots=eight", "hosts:1", "got 'eight'", id="slots-word"),
        pytest.param("node1 slots=2.5", "hosts:1", "got '2.5'", id="slots-float"),
        pytest.param("node1 slots=", "hosts:1", "got ''", id="slots-empty"),
        pytest.param("node1:0", "hosts:1", "positive integer, got '0'", id="colon-zero"),
        pytest.param("node1 slots=8 max_slots=4", "hosts:1", "max_slots=4 below slots=8", id="max-below"),
        pytest.param("node1 slots=8 slots=4", "hosts:1", "slots is given twice", id="slots-twice"),
        pytest.param("node1:8 slots=8", "hosts:1", "slots is given twice", id="colon-and-slots"),
        pytest.param(
            "node1 slots=8\n# x\nnode1 slots=8\n",
            "hosts:3",
            "'node1' is listed again (first at line 1)",
            id="duplicate-host",
        ),
        pytest.param("my node slots=8", "hosts:1", "unexpected 'node' after host 'my'", id="space-in-name"),
        pytest.param("node1 node2", "hosts:1", "one host per line", id="two-hosts-one-line"),
        pytest.param("node1;reboot slots=8", "hosts:1", "contains ';'", id="semicolon"),
        pytest.param("$(reboot) slots=8", "hosts:1", "contains '$'", id="dollar"),
        pytest.param("'node1' slots=8", "hosts:1", 'contains "\'"', id="single-quote"),
        pytest.param('"node1" slots=8', "hosts:1", "contains '\"'", id="double-quote"),
        pytest.param("node`id` slots=8", "hosts:1", "contains '`'", id="backtick"),
        pytest.param("-oProxyCommand slots=8", "hosts:1", "starts with '-'", id="leading-dash"),
        pytest.param("node..a", "hosts:1", "empty label", id="empty-label"),
        pytest.param("slots=8", "hosts:1", "first word must be the host name", id="missing-host"),
        pytest.param("bad user@node1", "hosts:1", "unexpected 'user@node1'", id="space-in-user"),
        pytest.param("r$t@node1", "hosts:1", "user 'r$t'", id="bad-user"),
        pytest.param("a" * 254, "hosts:1", "254 characters", id="too-long"),
    ],
)
def test_parse_bad_names_line_and_problem(text, where, problem):
    with pytest.raises(HostfileError) as info:
        parse_hostfile(text, source="hosts")
    message = str(info.value)
    assert message.startswith(where + ":"), message
    assert problem in message


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n   # another\n"])
def test_parse_no_hosts(text):
    with pytest.raises(HostfileError, match=r"^hosts: no hosts found"):
        parse_hostfile(text, source="hosts")


def test_read_hostfile(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("node1 slots=8\nnode2 slots=8\n", encoding="utf-8")
    hostfile = read_hostfile(path)
    assert hostfile.hosts == ("node1", "node2")
    assert hostfile.source == str(path)


def test_read_hostfile_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(HostfileError, match=re.escape(f"hostfile {missing} does not exist")):
        read_hostfile(missing)
    with pytest.raises(HostfileError, match="is a directory"):
        read_hostfile(tmp_path)
    bad = tmp_path / "bad"
    bad.write_text("node1 lots=8\n", encoding="utf-8")
    with pytest.raises(HostfileError, match="^" + re.escape(f"{bad}:1: unknown key 'lots'")):
        read_hostfile(bad)
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(HostfileError, match="not UTF-8"):
        read_hostfile(binary)


def test_writers_fill_default_slots_and_keep_users():
    hostfile = parse_hostfile("node1 slots=4 max_slots=8\nbob@node2\nnode3:2\n")
    assert to_deepspeed(hostfile, default_slots=8) == "node1 slots=4\nbob@node2 slots=8\nnode3 slots=2\n"
    assert to_openmpi(hostfile, default_slots=8) == (
        "node1 slots=4 max_slots=8\nbob@node2 slots=8\nnode3 slots=2\n"
    )


def test_writers_round_trip():
    hostfile = parse_hostfile("a slots=8\nb slots=8 max_slots=9\n")
    assert parse_hostfile(to_openmpi(hostfile, 1)).entries == hostfile.entries
    assert parse_hostfile(to_deepspeed(hostfile, 1)).hosts == hostfile.hosts


@pytest.mark.parametrize("default", [0, -1, True, 2.0])
def test_writers_refuse_bad_default(default):
    hostfile = parse_hostfile("a")
    with pytest.raises(HostfileError, match="default_slots must be a positive integer"):
        to_deepspeed(hostfile, default)


def test_openmpi_writer_refuses_default_above_max_slots():
    hostfile = parse_hostfile("a max_slots=4", source="hosts")
    with pytest.raises(HostfileError, match=r"hosts:1: host 'a' has max_slots=4 below the default slots=8"):
        to_openmpi(hostfile, 8)


def test_hostfile_to_json():
    hostfile = parse_hostfile("alice@n1 slots=8 max_slots=8\nn2\n")
    assert hostfile_to_json(hostfile) == [
        {"host": "n1", "slots": 8, "max_slots": 8, "user": "alice"},
        {"host": "n2", "slots": None, "max_slots": None, "user": None},
    ]


def test_hostfile_from_hosts():
    hostfile = hostfile_from_hosts(["n1", "n2"], slots=4, source="SLURM_JOB_NODELIST")
    assert hostfile == Hostfile(entries=(entry("n1", 4), entry("n2", 4, line=2)), source="SLURM_JOB_NODELIST")
    with pytest.raises(HostfileError, match=r"^src:2: host 'n1' is listed again \(first at position 1\)"):
        hostfile_from_hosts(["n1", "n1"], source="src")
    with pytest.raises(HostfileError, match=r"^src:1: host name 'a b' contains ' '"):
        hostfile_from_hosts(["a b"], source="src")
    with pytest.raises(HostfileError, match="no hosts"):
        hostfile_from_hosts([], source="src")


@pytest.mark.parametrize("name", ["node1", "10.1.2.3", "gpu-a100_07.dc1", "N"])
def test_hostname_ok(name):
    assert hostname_problem(name) is None


@pytest.mark.parametrize("name", ["", "a b", "a;b", "a|b", "a&b", "a>b", "a/b", "a\nb", "-a", ".a", "a:1"])
def test_hostname_refused(name):
    assert hostname_problem(name)


def test_entries_are_frozen():
    hostfile = parse_hostfile("a slots=1")
    with pytest.raises(AttributeError):
        hostfile.entries[0].slots = 2  # type: ignore[misc]
