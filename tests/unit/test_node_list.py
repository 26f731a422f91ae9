"""The spec stage (`session.spec`): ``--gpucluster-exclude`` leaves named nodes out from the start,
by full or short name, and refuses a name the list does not hold (a typo must not keep a bad node in)."""

from __future__ import annotations

import pytest

from pytest_gpucluster.errors import SettingsError
from pytest_gpucluster.options.cluster import host_list
from pytest_gpucluster.session.spec import excluded_from

HOSTS = ("gpu-001.cluster", "gpu-002.cluster", "gpu-003.cluster")


def test_host_list_reads_comma_separated_names_and_refuses_empty_ones():
    assert host_list("gpu-001, gpu-002") == ("gpu-001", "gpu-002")
    with pytest.raises(ValueError, match=r"HOST\[,HOST\.\.\.\]"):
        host_list("gpu-001,,gpu-002")


def test_exclude_matches_full_and_short_names_in_list_order():
    assert excluded_from(HOSTS, ("gpu-003", "gpu-001.cluster"), "hostfile h", "command line") == (
        "gpu-001.cluster",
        "gpu-003.cluster",
    )
    assert excluded_from(HOSTS, (), "hostfile h", "default") == ()


def test_an_unknown_name_or_excluding_every_node_is_a_usage_error():
    with pytest.raises(SettingsError, match="names gpu-009, which the hostfile h does not list"):
        excluded_from(HOSTS, ("gpu-009",), "hostfile h", "command line")
    with pytest.raises(SettingsError, match="leaves no node"):
        excluded_from(HOSTS, ("gpu-001", "gpu-002", "gpu-003"), "hostfile h", "command line")
