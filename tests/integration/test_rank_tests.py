"""``@pytest.mark.world_size(n)`` + ``process_group``: one test body on n real gloo ranks.

One inner pytest run holds every case, so the whole file costs one session and three launches.
The inner run uses the rank-test machinery on its own (``-p no:gpucluster``, registered by a
conftest) with a cluster set through ``rank_tests.CLUSTER_KEY``, as the plugin does.
"""

from __future__ import annotations

import pytest

from pytest_gpucluster.launch import get_launcher

pytestmark = pytest.mark.skipif(
    get_launcher("torchrun").available() is not None, reason="torch is not installed"
)

CONFTEST = """
from pytest_gpucluster import rank_tests
from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import Cluster

pytest_plugins = ["pytest_gpucluster.rank_tests"]


def pytest_configure(config):
    config.stash[rank_tests.CLUSTER_KEY] = lambda: Cluster(
        ClusterSpec.from_local(2, backend="gloo"), get_launcher("torchrun"), {results!r}
    )
"""

TESTS = """
import os
import pytest


@pytest.mark.world_size(2)
def test_all_reduce_on_two_ranks(process_group):
    import torch
    import torch.distributed as dist

    assert os.environ["GPUCLUSTER_RANK_SIDE"] == "1"
    assert dist.get_world_size(process_group) == 2
    tensor = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(tensor, group=process_group)
    assert tensor.item() == 3.0


@pytest.mark.world_size(2)
def test_fails_on_rank_one_only(process_group):
    import torch.distributed as dist

    rank = dist.get_rank()
    assert rank == 0, f"rank {rank} disagrees"


@pytest.mark.world_size(2)
def test_skips_on_rank_one(process_group):
    import torch.distributed as dist

    if dist.get_rank() == 1:
        pytest.skip("no widget on this rank")


def test_process_group_needs_the_marker(process_group):
    pass
"""


def test_world_size_tests_pass_fail_and_skip_per_rank(pytester):
    pytester.makeconftest(CONFTEST.format(results=str(pytester.path / "results")))
    pytester.makepyfile(test_ranks=TESTS)
    result = pytester.runpytest("-p", "no:gpucluster", "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, failed=1, skipped=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_ranks.py::test_fails_on_rank_one_only failed on rank 1 of 2",
            "rank 1 failed (on *):",
            "*AssertionError: rank 1 disagrees",
            "*log: *rank-1.log",
            "job directory: *",
        ]
    )
    result.stdout.fnmatch_lines(["SKIPPED * skipped on rank 1: no widget on this rank"])
    result.stdout.fnmatch_lines(["*uses the process_group fixture without @pytest.mark.world_size(n)*"])
    assert "rank 0 failed" not in result.stdout.str()
