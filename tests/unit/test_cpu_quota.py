"""testbed/cpu_quota.py (the real slowdown the regression gate and the sensitivity benchmark use)
and workloads/_cgroup.py (how a rank joins it): the cgroup's settings, who joins, and cleanup.

No timing is asserted: that the quota slows ranks is what benchmarks/gate_noise.py and
benchmarks/threshold_sensitivity.py measure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gpucluster.testbed.cpu_quota import (
    CpuController,
    CpuQuota,
    QuotaUnavailable,
    cpu_quota,
    find_cpu_controller,
    unavailable_reason,
)
from pytest_gpucluster.workloads._cgroup import RANK_CGROUP_ENV, join_rank_cgroup

# /proc/self/mounts of this VM class (Debian 12, cgroup v1 cpu next to an empty v2 unified tree)
V1_AND_UNIFIED = """\
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,nosuid,nodev,noexec,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0
"""


def test_the_v1_cpu_hierarchy_is_found_among_the_mounts():
    assert find_cpu_controller(V1_AND_UNIFIED) == CpuController(1, Path("/sys/fs/cgroup/cpu"))


def test_no_cpu_controller_is_an_error_listing_what_is_mounted():
    text = "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\nproc /proc proc rw 0 0\n"
    with pytest.raises(
        QuotaUnavailable, match=r"no cgroup hierarchy with the cpu controller.*memory \(cgroup\)"
    ):
        find_cpu_controller(text)


@pytest.mark.parametrize(("cpus", "quota_us"), [(0.5, 50_000), (2 / 3, 66_667), (0.001, 1000)])
def test_the_quota_is_cpus_times_the_period_and_never_below_the_kernels_minimum(cpus, quota_us):
    assert CpuQuota(CpuController(1, Path("/nowhere")), cpus).quota_us == quota_us


def test_a_quota_is_a_positive_number_of_cpus():
    with pytest.raises(ValueError, match="positive number of CPUs"):
        CpuQuota(CpuController(1, Path("/nowhere")), 0)


def test_a_rank_told_to_join_something_that_is_not_a_cgroup_fails_naming_the_variable(tmp_path):
    with pytest.raises(RuntimeError, match=f"{RANK_CGROUP_ENV}=.* is not a cgroup directory"):
        join_rank_cgroup({RANK_CGROUP_ENV: str(tmp_path)})
    assert join_rank_cgroup({}) is None  # unset: nothing to join


@pytest.mark.skipif(bool(unavailable_reason()), reason=f"no CPU quota here: {unavailable_reason()}")
def test_a_rank_joins_the_quota_and_nothing_else_does_and_the_cgroup_goes_away():
    join = (
        "from pytest_gpucluster.workloads._cgroup import join_rank_cgroup; join_rank_cgroup(); "
        "print(open('/proc/self/cgroup').read())"
    )
    with cpu_quota(0.5) as quota:
        if quota.controller.version == 1:
            assert (quota.path / "cpu.cfs_quota_us").read_text().strip() == "50000"
            assert (quota.path / "cpu.cfs_period_us").read_text().strip() == "100000"
        else:
            assert (quota.path / "cpu.max").read_text().split() == ["50000", "100000"]
        done = subprocess.run(
            [sys.executable, "-c", join],
            env={**os.environ, **quota.env},
            capture_output=True,
            text=True,
            check=True,
        )
        assert quota.path.name in done.stdout  # the rank's own cgroup line names the quota
        assert quota.path.name not in Path("/proc/self/cgroup").read_text()  # pytest never joins
        path = quota.path
    assert not path.exists()
