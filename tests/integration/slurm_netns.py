"""A real multi-node Slurm on one machine: slurmctld in a login-node namespace, one slurmd per
network-namespace node (`testbed.netns`), each node its own address and hostname.

test_slurm.py's Slurm is one node: a job whose hosts come in the wrong order, a pair whose suspect
sorts after its partner, a listener that must outlive other steps on the same nodes are questions
about several nodes, and only separate addresses make a wrong ``MASTER_ADDR`` fail (on one host
every name reaches the rank that listens). Here:

- ``NodeName=<tag>n<i> NodeAddr=10.x.y.<i+1> Gres=gpu:8`` per node (eight ``mknod`` stand-ins for
  /dev/nvidia*: slurm_daemons.py, which test_slurm.py shares), ``SlurmctldHost=<tag>ctl``;
- **``ProctrackType=proctrack/cgroup``** (Slurm's default where cgroups exist): when a step ends,
  slurmstepd kills everything left in the step's cgroup, a ``setsid`` grandchild included. It works
  in this container with cgroup v1's freezer, with one twist: ``ip netns exec`` remounts /sys, which
  hides /sys/fs/cgroup from a slurmd started in a namespace. So each node gets a freezer cgroup of
  its own, ``/sys/fs/cgroup/freezer/<tag>n<i>``, bind-mounted at ``<dir>/cg-<node>/freezer``, and its
  own copy of the configuration whose ``cgroup.conf`` says ``CgroupMountpoint=<dir>/cg-<node>``
  (two slurmds sharing one freezer tree would put one job's steps on both nodes in one cgroup, and
  the first node to finish would kill the other's tasks). ``TaskPlugin=task/none``: no cpuset or
  device binding, which a shared kernel cannot give per node;
- a ``bin/`` of client wrappers (srun, salloc, sbatch, squeue, scancel, scontrol, sinfo), each
  ``ip netns exec <tag>ctl <tool> "$@"``: put first on PATH, this process and the pytest it starts
  are the login node, and the launcher's plain ``srun`` reaches the nodes.

`netns_slurm` yields a `NetnsSlurm`, or skips naming what is missing (root, iproute2, Slurm, the
freezer cgroup); it stops every daemon, kills whatever still carries its ``SLURM_CONF``, unmounts and
removes the cgroups and the namespaces. Run heavy manual runs under ``flock /tmp/heavy.lock``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns_bed import netns_bed_or_skip
from slurm_daemons import SBIN, SlurmClient, require_slurm, start_daemon, stop, write_conf

from pytest_gpucluster.testbed.netns import NetnsTestbed

CLIENTS = ("srun", "salloc", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
FREEZER = Path("/sys/fs/cgroup/freezer")


class NetnsSlurm(SlurmClient):
    """The running cluster: its nodes in Slurm's order, the login node's environment."""

    def __init__(self, bed: NetnsTestbed, directory: Path) -> None:
        self.bed = bed
        self.bin = directory / "bin"
        self.nodes = bed.names
        """In slurm.conf's order, which is Slurm's."""
        conf = directory / "slurm.conf"
        super().__init__(
            directory, {**os.environ, "SLURM_CONF": str(conf), "PATH": f"{self.bin}{os.pathsep}{SBIN}"}
        )


def _write_config(slurm: NetnsSlurm, proctrack: str) -> None:
    bed, directory = slurm.bed, slurm.dir
    text = write_conf(
        directory,
        cluster=f"gcn{os.getpid()}",
        controller=(bed.controller.name, bed.controller.address),
        nodes=[(n.name, n.address) for n in bed.nodes],
        proctrack=proctrack,
    )
    gres = (directory / "gres.conf").read_text()
    (directory / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n")
    for node in bed.names:  # each slurmd: the same slurm.conf, its own cgroup.conf (module docstring)
        own = directory / f"conf-{node}"
        own.mkdir()
        (own / "slurm.conf").write_text(text)
        (own / "gres.conf").write_text(gres)
        (own / "cgroup.conf").write_text(
            f"CgroupPlugin=cgroup/v1\nCgroupMountpoint={directory / f'cg-{node}'}\n"
        )
    slurm.bin.mkdir()
    for tool in CLIENTS:
        real = shutil.which(tool, path=SBIN)
        wrapper = slurm.bin / tool
        wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {bed.controller.name} {real} "$@"\n')
        wrapper.chmod(0o755)


def _cgroups(slurm: NetnsSlurm) -> list[Path]:
    """Each node's own freezer cgroup, bind-mounted where its cgroup.conf looks (module docstring)."""
    mounts = []
    for node in slurm.nodes:
        own = FREEZER / node
        own.mkdir(exist_ok=True)
        target = slurm.dir / f"cg-{node}" / "freezer"
        target.mkdir(parents=True)
        subprocess.run(["mount", "--bind", str(own), str(target)], check=True, capture_output=True)
        mounts.append(target)
    return mounts


def _remove_cgroups(slurm: NetnsSlurm, mounts: list[Path]) -> None:
    for target in mounts:
        subprocess.run(["umount", "-l", str(target)], check=False, capture_output=True)
    for node in slurm.nodes:
        # Slurm's own tree under the node's cgroup, deepest first (it removes its steps' itself);
        # a process still in it is this cluster's (a step cut short) and is killed first.
        own = FREEZER / node
        tree = [own, *(p for p in own.rglob("*") if p.is_dir())] if own.is_dir() else []
        for group in tree:
            with contextlib.suppress(OSError, ValueError):
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
        for path in sorted(tree, key=lambda p: len(p.parts), reverse=True):
            for _ in range(20):  # a killed process leaves its cgroup a moment later
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


@contextlib.contextmanager
def netns_slurm(directory: Path, nodes: int = 3, proctrack: str = "proctrack/cgroup") -> Iterator[NetnsSlurm]:
    """The cluster for the block (see the module docstring), or a skip saying what is missing."""
    require_slurm(("slurmctld", "slurmd", *CLIENTS))
    if proctrack == "proctrack/cgroup" and not (FREEZER / "cgroup.procs").exists():
        pytest.skip(
            f"proctrack/cgroup needs cgroup v1's freezer controller, which is not mounted at {FREEZER}"
        )
    with netns_bed_or_skip(nodes, controller=True) as bed:
        slurm = NetnsSlurm(bed, directory)
        _write_config(slurm, proctrack)
        mounts: list[Path] = []
        procs: list[subprocess.Popen] = []
        try:
            mounts = _cgroups(slurm) if proctrack == "proctrack/cgroup" else []
            daemons = [(bed.controller.name, ["slurmctld", "-D", "-i", "-f", str(slurm.conf)], "slurmctld")]
            daemons += [
                (
                    node,
                    ["slurmd", "-D", "-f", str(directory / f"conf-{node}" / "slurm.conf"), "-N", node],
                    node,
                )
                for node in slurm.nodes
            ]
            for where, argv, name in daemons:
                argv[0] = shutil.which(argv[0], path=SBIN) or argv[0]
                procs.append(start_daemon(bed.exec_argv(where, argv), slurm.env, directory / f"{name}.out"))
            if not slurm.wait_idle(len(slurm.nodes), 40):
                state = slurm.run("sinfo", "-h", "-o", "%t %D %E").stdout.strip() or "no answer"
                pytest.skip(
                    f"the namespace Slurm did not become idle in 40 s (sinfo: {state})\n"
                    f"slurmctld.log:\n{slurm.log('slurmctld.log')}\n"
                    f"slurmd ({slurm.nodes[0]}):\n{slurm.log(slurm.nodes[0] + '.out')}"
                )
            yield slurm
        finally:
            stop(procs, slurm, slurm.conf)
            _remove_cgroups(slurm, mounts)
