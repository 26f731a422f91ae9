"""Options that say what is tested: the hardware profile and the nodes and ranks to use.

Part of the option table that `options` assembles; must not import pytest.
"""

from __future__ import annotations

from pytest_gpucluster.options.spec import Option, positive_int, user_path

HW = Option(
    "--hw",
    "hw",
    "hardware profile: a name from thresholds/ or a path to a YAML file; "
    "'auto' picks cpu-local without CUDA, else the profile whose GPU model matches",
    "auto",
    metavar="PROFILE|PATH",
)
THRESHOLDS_DIR = Option(
    "--thresholds-dir",
    "thresholds_dir",
    "extra directory of profile YAML files, searched before the shipped ones",
    None,
    user_path,
    "DIR",
)
HOSTFILE = Option(
    "--hostfile",
    "hostfile",
    "hostfile (DeepSpeed 'host slots=N' or Open MPI format) naming the nodes to test",
    None,
    user_path,
    "FILE",
)
NNODES = Option(
    "--nnodes",
    "nnodes",
    "number of nodes to use (default: all the cluster has)",
    None,
    positive_int,
    "N",
)
NPROC_PER_NODE = Option(
    "--nproc-per-node",
    "nproc_per_node",
    "ranks per node (default: the profile's)",
    None,
    positive_int,
    "N",
)
