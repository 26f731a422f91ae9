"""Slurm nodelist expansion and compression (pure)."""

from __future__ import annotations

import pytest

from pytest_gpucluster.cluster.nodelist import MAX_HOSTS, compress_nodelist, expand_nodelist
from pytest_gpucluster.errors import HostfileError


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        pytest.param("n1", ["n1"], id="single"),
        pytest.param("n1,n2", ["n1", "n2"], id="plain-list"),
        pytest.param("n3,n1,n2", ["n3", "n1", "n2"], id="unsorted-kept"),
        pytest.param(
            "node[001-008,010]",
            [f"node{i:03d}" for i in range(1, 9)] + ["node010"],
            id="zero-padded-ranges",
        ),
        pytest.param("node[8-11]", ["node8", "node9", "node10", "node11"], id="unpadded-growing-width"),
        pytest.param("node[08-11]", ["node08", "node09", "node10", "node11"], id="padding-from-first"),
        pytest.param(
            "gpu-[1-2]-[01-04]",
            ["gpu-1-01", "gpu-1-02", "gpu-1-03", "gpu-1-04", "gpu-2-01", "gpu-2-02", "gpu-2-03", "gpu-2-04"],
            id="two-groups-leftmost-slowest",
        ),
        pytest.param(
            "rack[0-1]_blade[0-1]",
            ["rack0_blade0", "rack0_blade1", "rack1_blade0", "rack1_blade1"],
            id="slurm-conf-example-shape",
        ),
        pytest.param("a-[1-2],b-[003,005]", ["a-1", "a-2", "b-003", "b-005"], id="two-terms"),
        pytest.param("node[3,1,2]", ["node3", "node1", "node2"], id="bracket-order-kept"),
        pytest.param("n[1-2].ib", ["n1.ib", "n2.ib"], id="suffix"),
        pytest.param("n[1-2] m1\tm2", ["n1", "n2", "m1", "m2"], id="whitespace-separated"),
        pytest.param("n1,,n2,", ["n1", "n2"], id="empty-terms-skipped"),
        pytest.param("n[1-3,2-4]", ["n1", "n2", "n3", "n2", "n3", "n4"], id="duplicates-kept-like-scontrol"),
        pytest.param("[1-2]", ["1", "2"], id="no-prefix"),
    ],
)
def test_expand(expr, expected):
    assert expand_nodelist(expr) == expected


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        pytest.param("", "is empty", id="empty"),
        pytest.param("  ", "is empty", id="blank"),
        pytest.param(",", "names no hosts", id="only-commas"),
        pytest.param("node[1-3", "'[' at position 4 has no matching ']'", id="unclosed"),
        pytest.param("node1-3]", "']' at position 7 has no matching '['", id="unopened"),
        pytest.param("node[[1-2]]", "nested '['", id="nested"),
        pytest.param("node[5-3]", "range '5-3' in 'node[5-3]' runs backwards (5 > 3)", id="reversed"),
        pytest.param("node[]", "'' in 'node[]' is not a number", id="empty-brackets"),
        pytest.param("node[a-c]", "'a-c' in 'node[a-c]' is not a number", id="letters"),
        pytest.param("node[1-]", "'1-'", id="open-range"),
        pytest.param("node[1-2];reboot", "contains ';'", id="shell-metachar"),
        pytest.param("node[0-100000]", f"the limit is {MAX_HOSTS}", id="huge-range"),
        pytest.param("a[0-999]b[0-999]", f"more than {MAX_HOSTS} hosts", id="huge-product"),
    ],
)
def test_expand_bad(expr, problem):
    with pytest.raises(HostfileError) as info:
        expand_nodelist(expr)
    assert problem in str(info.value)
    if expr.strip():
        assert repr(expr) in str(info.value)


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        (["n1"], "n1"),
        (["login"], "login"),
        (["node001", "node002", "node003", "node010"], "node[001-003,010]"),
        (["n8", "n9", "n10"], "n[8-10]"),
        (["n3", "n1", "n2"], "n[3,1-2]"),
        (["a1", "b1", "a2"], "a1,b1,a2"),
        (["n1", "n01"], "n[1,01]"),
        (["gpu-1-01", "gpu-1-02", "gpu-2-01"], "gpu-1-[01-02],gpu-2-01"),
    ],
)
def test_compress(hosts, expected):
    assert compress_nodelist(hosts) == expected
    assert expand_nodelist(expected) == hosts


@pytest.mark.parametrize(
    "expr", ["node[001-064]", "a-[1-2],b-[003,005],c", "gpu-[1-3]-[01-04]", "n[9-12,07-08,1]"]
)
def test_compress_round_trip(expr):
    hosts = expand_nodelist(expr)
    assert expand_nodelist(compress_nodelist(hosts)) == hosts


def test_compress_refuses_bad_names():
    with pytest.raises(HostfileError, match="contains ' '"):
        compress_nodelist(["a b"])
