"""A real multi-node Slurm on one machine: slurmctld in a login-node namespace, one slurmd per
network-namespace node (`testbed.netns`), each node its own address and hostname.

test_slurm.py's Slurm is one node: a job whose hosts come in the wrong order, a pair whose suspect
sorts after its partner, a listener that must outlive other steps on the same nodes are questions
about several nodes, and only separate addresses make a wrong ``MASTER_ADDR`` fail (on one host
every name reaches the rank that listens). Here:

- ``NodeName=<tag>n<i> NodeAddr=10.x.y.<i+1> Gres=gpu:8`` per node (eight ``mknod`` stand-ins for
  /dev/nvidia*, as in test_slurm.py), ``SlurmctldHost=<tag>ctl``;
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
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns_bed import netns_bed_or_skip

from pytest_gpucluster.testbed.netns import NetnsTestbed

CLIENTS = ("srun", "salloc", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
FREEZER = Path("/sys/fs/cgroup/freezer")

CONF = """\
ClusterName=gcn{suffix}
SlurmctldHost={ctl}({ctl_addr})
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
MpiDefault=none
ProctrackType={proctrack}
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
ReturnToService=2
MailProg=/bin/true
KillWait=5
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class NetnsSlurm:
    """The running cluster: its nodes in Slurm's order, the login node's environment."""

    def __init__(self, bed: NetnsTestbed, directory: Path) -> None:
        self.bed = bed
        self.dir = directory
        self.conf = directory / "slurm.conf"
        self.bin = directory / "bin"
        self.nodes = bed.names
        """In slurm.conf's order, which is Slurm's."""
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "PATH": f"{self.bin}{os.pathsep}{SBIN}"}

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm client command, run from the login node."""
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def jobs(self) -> list[str]:
        return self.run("squeue", "--noheader", "--format=%A %j %T").stdout.splitlines()

    def steps(self) -> list[str]:
        return self.run("squeue", "--noheader", "--steps", "--format=%i %j").stdout.splitlines()

    def wait_until(self, check, seconds: float = 15.0) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if check():
                return True
            time.sleep(0.2)
        return bool(check())

    def log(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join((self.dir / name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _pids_with_env(needle: str) -> list[int]:
    want = needle.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if want in handle.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _write_config(slurm: NetnsSlurm, proctrack: str) -> None:
    bed, directory = slurm.bed, slurm.dir
    (directory / "state").mkdir()
    devices = directory / "dev"
    devices.mkdir()
    for index in range(8):
        os.mknod(devices / f"nvidia{index}", 0o644 | stat.S_IFCHR, os.makedev(1, 3))
    nodes = "".join(
        f"NodeName={n.name} NodeAddr={n.address} CPUs=8 Gres=gpu:8 State=UNKNOWN\n" for n in bed.nodes
    )
    text = CONF.format(
        suffix=os.getpid(), ctl=bed.controller.name, ctl_addr=bed.controller.address, dir=directory,
        proctrack=proctrack, nodes=nodes,
    )  # fmt: skip
    gres = f"Name=gpu File={devices}/nvidia[0-7]\n"
    slurm.conf.write_text(text)
    (directory / "gres.conf").write_text(gres)
    (directory / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n")
    for node in bed.names:  # each slurmd: the same slurm.conf, its own cgroup.conf (module docstring)
        own = directory / f"conf-{node}"
        own.mkdir()
        (own / "slurm.conf").write_text(text)
        (own / "gres.conf").write_text(gres)
        (own / "cgroup.conf").write_text(
            f"CgroupPlugin=cgroup/v1\nCgroupMountpoint={directory / f'cg-{node}'}\n"
        )
        (directory / f"spool-{node}").mkdir()
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


def _stop(procs: list[subprocess.Popen], slurm: NetnsSlurm) -> None:
    with contextlib.suppress(Exception):
        slurm.run("scancel", "--user=root", timeout=10)
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _pids_with_env(f"SLURM_CONF={slurm.conf}"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        end = time.monotonic() + 3
        while _pids_with_env(f"SLURM_CONF={slurm.conf}") and time.monotonic() < end:
            time.sleep(0.1)


@contextlib.contextmanager
def netns_slurm(directory: Path, nodes: int = 3, proctrack: str = "proctrack/cgroup") -> Iterator[NetnsSlurm]:
    """The cluster for the block (see the module docstring), or a skip saying what is missing."""
    missing = [t for t in ("slurmctld", "slurmd", *CLIENTS) if shutil.which(t, path=SBIN) is None]
    if missing:
        pytest.skip(
            f"Slurm is not installed here ({', '.join(missing)} not found); apt-get install slurm-wlm"
        )
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
                with open(directory / f"{name}.out", "wb") as out:
                    procs.append(
                        subprocess.Popen(
                            bed.exec_argv(where, argv),
                            env=slurm.env,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
            want = f"idle {len(slurm.nodes)}"
            if not slurm.wait_until(
                lambda: slurm.run("sinfo", "-h", "-o", "%t %D").stdout.strip() == want, 40
            ):
                state = slurm.run("sinfo", "-h", "-o", "%t %D %E").stdout.strip() or "no answer"
                pytest.skip(
                    f"the namespace Slurm did not become idle in 40 s (sinfo: {state})\n"
                    f"slurmctld.log:\n{slurm.log('slurmctld.log')}\n"
                    f"slurmd ({slurm.nodes[0]}):\n{slurm.log(slurm.nodes[0] + '.out')}"
                )
            yield slurm
        finally:
            _stop(procs, slurm)
            _remove_cgroups(slurm, mounts)
