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


def host_list(text: str) -> tuple[str, ...]:
    """``HOST[,HOST...]`` -> the names, stripped; an empty name is refused."""
    names = tuple(part.strip() for part in text.split(","))
    if not names or any(not name for name in names):
        raise ValueError(f"expected host names separated by commas (HOST[,HOST...]), got {text!r}")
    return names


EXCLUDE = Option(
    "--gpucluster-exclude",
    "exclude",
    "leave these nodes out from the start (known bad, being repaired): they are not probed, not "
    "launched on, and named in results.json and the report as excluded; repeatable",
    (),
    host_list,
    "HOST[,HOST...]",
    multiple=True,
)
