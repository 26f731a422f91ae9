"""profiles/nccl_env.py: NCCL_ALGO and NCCL_IB_HCA read the way NCCL reads them."""

import pytest

from pytest_gpucluster.profiles.nccl_env import (
    algo_syntax_problem,
    allowed_algorithms,
    nic_selection,
    prefix_entries,
    scope_env,
)
from pytest_gpucluster.profiles.schema import ProfileModel

ALL_REDUCE = {"Ring", "Tree", "NVLS", "NVLSTree", "CollNetDirect", "CollNetChain"}


@pytest.mark.parametrize(
    ("env", "collective", "nodes", "expected"),
    [
        ({}, "all_reduce", 1, {"Ring", "Tree", "NVLS"}),  # NVLSTree needs 2+ nodes, CollNet its flag
        ({}, "all_reduce", 2, {"Ring", "Tree", "NVLSTree"}),  # NVLS across nodes needs CollNet
        ({"NCCL_COLLNET_ENABLE": "1"}, "all_reduce", 2, ALL_REDUCE),
        ({"NCCL_ALGO": "Ring,Tree"}, "all_reduce", 1, {"Ring", "Tree"}),
        ({"NCCL_ALGO": "ring,tree"}, "all_gather", 1, {"Ring"}),  # case-insensitive, as strcasecmp
        ({"NCCL_ALGO": "^NVLS"}, "all_reduce", 1, {"Ring", "Tree"}),
        ({"NCCL_ALGO": "Tree"}, "all_gather", 1, set()),  # Tree runs all_reduce only
        ({"NCCL_ALGO": "allreduce:Tree"}, "all_reduce", 2, {"Tree"}),
        ({"NCCL_ALGO": "allreduce:Tree"}, "all_gather", 2, {"Ring", "PAT"}),  # others keep defaults
        ({"NCCL_ALGO": "Ring;allreduce:Tree,NVLS"}, "all_reduce", 1, {"Tree", "NVLS"}),
        ({"NCCL_ALGO": "Ring;allreduce:Tree,NVLS"}, "broadcast", 1, {"Ring"}),
        ({"NCCL_NVLS_ENABLE": "0"}, "all_reduce", 1, {"Ring", "Tree"}),
        ({"NCCL_ALGO": "Ring,Bogus"}, "all_reduce", 1, set()),
    ],
)
def test_allowed_algorithms(env, collective, nodes, expected):
    assert allowed_algorithms(env, collective, nodes) == frozenset(expected)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("Ring,Tree", None),
        ("ring;allreduce:tree", None),
        ("Ring,Bogus", "unknown algorithm 'Bogus'"),
        ("allgather:Ring;Tree", "every entry after the first needs a function prefix"),
        ("allgatherx:Ring", "unknown function 'allgatherx'"),
    ],
)
def test_algo_syntax(value, problem):
    found = algo_syntax_problem({"NCCL_ALGO": value})
    assert (found is None) if problem is None else (problem in found)


@pytest.mark.parametrize(
    ("value", "exact_count", "loose"),
    [
        ("mlx5_0,mlx5_1", None, ("mlx5_1",)),
        ("=mlx5_0,mlx5_1", 2, ()),
        ("=mlx5_0:1,mlx5_3:1,mlx5_4:1", 3, ()),
        ("mlx5", None, ("mlx5",)),
        ("mlx5_0", None, ()),
        ("^mlx5_1", None, ("mlx5_1",)),  # an exclusion by prefix also excludes mlx5_10...
        ("^=mlx5_1", None, ()),
    ],
)
def test_nic_selection(value, exact_count, loose):
    selection = nic_selection({"NCCL_IB_HCA": value})
    assert selection.exact_count == exact_count
    assert prefix_entries(selection) == loose


def test_scope_env_puts_the_scope_over_the_profile_env():
    model = ProfileModel.model_validate(
        {
            "name": "t",
            "description": "t",
            "cluster": {"gpus_per_node": 8},
            "nccl_env": {"NCCL_ALGO": "Ring,Tree", "NCCL_IB_HCA": "=mlx5_0"},
            "collectives": {"scope_env": {"inter-node": {"NCCL_ALGO": "allreduce:Tree"}}},
        }
    )
    assert scope_env(model, "intra-node") == {"NCCL_ALGO": "Ring,Tree", "NCCL_IB_HCA": "=mlx5_0"}
    assert scope_env(model, "inter-node") == {"NCCL_ALGO": "allreduce:Tree", "NCCL_IB_HCA": "=mlx5_0"}
