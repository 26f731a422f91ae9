"""Variables set only on the controller reach the ranks on remote nodes, under mpirun and the
DeepSpeed runner too (torchrun through a remote-exec prefix: test_login_node_netns.py; srun:
test_slurm.py).

Two network-namespace nodes and a controller namespace (the login node). Open MPI reaches the
nodes through its ``rsh`` launcher as it reaches real ones through ssh: ``plm_rsh_agent`` names a
small script that enters the node's namespace (with its hostname) where ssh would log in, and
``oob_tcp_if_include`` keeps its wiring on the testbed's interface. DeepSpeed's runner takes its
``openmpi`` multi-node launcher with the same options. Each run is the plugin's own per-node probe
(``pytest acceptance/test_inventory.py -k test_nodes_probed``), whose rank on each node reports
the environment it was started with.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from netns_bed import netns_bed_or_skip

REPO = Path(__file__).parents[2]
_DROP_ENV = ("PYTEST_XDIST", "PYTEST_ADDOPTS", "_GPUCLUSTER", "GPUCLUSTER_")
RSH = """#!/bin/sh
# Open MPI's rsh agent for network-namespace nodes: "rsh HOST COMMAND..." runs COMMAND, a shell
# line as ssh would run it, inside the node's namespace with the node's hostname.
host="$1"; shift
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$*"' "$host" "$@"
"""

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")


@pytest.fixture(scope="module")
def bed():
    with netns_bed_or_skip(2, controller=True) as testbed:
        yield testbed


def _probe_through(bed, tmp_path: Path, launcher: str, launcher_args: str) -> dict:
    rsh = tmp_path / "rsh"
    rsh.write_text(RSH)
    rsh.chmod(rsh.stat().st_mode | stat.S_IEXEC)
    hostfile = tmp_path / "hosts"
    hostfile.write_text(bed.hostfile_text(slots=1))
    results = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_ENV)}
    env |= {"LD_LIBRARY_PATH": "/opt/x", "FI_PROVIDER": "efa", "MY_SITE_LICENSE": "27000@lic"}
    argv = [
        sys.executable, "-m", "pytest", "acceptance/test_inventory.py", "-k", "test_nodes_probed",
        "--hw=cpu-local", f"--hostfile={hostfile}", "--nproc-per-node=1", f"--launcher={launcher}",
        f"--launcher-args={launcher_args.format(rsh=rsh)}", "--forward-env=MY_SITE_*",
        f"--remote-exec={shlex.join(bed.remote_exec_template)}", f"--results-dir={results}",
        "-p", "no:cacheprovider", "-p", "no:xdist",
    ]  # fmt: skip
    done = subprocess.run(
        bed.exec_argv(bed.controller, argv), cwd=REPO, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return json.loads((results / "results.json").read_text())["nodes"]


def _assert_every_node_saw_the_controllers_variables(nodes: dict, bed) -> None:
    assert sorted(n["host"] for n in nodes["nodes"]) == sorted(bed.names)
    for node in nodes["nodes"]:
        env = node["env"]
        assert (env["LD_LIBRARY_PATH"], env["FI_PROVIDER"]) == ("/opt/x", "efa"), env
        assert env["MY_SITE_LICENSE"] == "27000@lic", env  # a --forward-env pattern


MPI_ARGS = "--mca plm_rsh_agent {rsh} --mca oob_tcp_if_include gpc0"


def test_mpirun_carries_the_controllers_environment_to_every_node(bed, tmp_path):
    nodes = _probe_through(bed, tmp_path, "mpirun", MPI_ARGS)
    assert nodes["source"].startswith("probe jobs, one per node, in parallel")
    _assert_every_node_saw_the_controllers_variables(nodes, bed)


def test_the_deepspeed_runner_carries_it_through_its_env_file(bed, tmp_path):
    inner = f"--allow-run-as-root {MPI_ARGS} --mca btl_tcp_if_include gpc0"
    nodes = _probe_through(bed, tmp_path, "deepspeed", f"--launcher=openmpi --launcher_args='{inner}'")
    _assert_every_node_saw_the_controllers_variables(nodes, bed)
