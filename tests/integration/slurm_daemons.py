"""What the tests' two real Slurms share: slurm.conf, the client, GPU stand-ins, start and stop.

test_slurm.py's ``slurm_cluster`` (one node on 127.0.0.1, ``proctrack/linuxproc``) and
slurm_netns.py's ``netns_slurm`` (slurmctld and one slurmd per network-namespace node) write the
same slurm.conf but for the lines that differ (`write_conf`'s arguments), hand out the same
client (`SlurmClient`), start their daemons the same way (`start_daemon`) and stop them the same
way (`stop`): cancel every job, SIGTERM each daemon's session, then kill whatever still carries the
cluster's ``SLURM_CONF`` (slurmstepd and ranks daemonize away from slurmd).

Slurm 22.05 drops GPUs without device files from gres.conf (its slurmd logs "Removing file-less
GPU gpu:(null) from final GRES list"), so `gpu_devices` makes eight character devices with
``mknod`` (the major/minor of /dev/null): Slurm only stats them (``TaskPlugin=task/none``: no
cgroup device binding) and sets ``CUDA_VISIBLE_DEVICES`` per step as it would on a GPU node.
Authentication is ``auth/none``: no munge key to share, fine in a sandbox only.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])

CONF = """\
ClusterName={cluster}
SlurmctldHost={ctl}({ctl_addr})
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser={user}
SlurmdUser={user}
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


def require_slurm(tools: Sequence[str]) -> None:
    """Skip, naming what is missing, unless every one of ``tools`` is installed."""
    missing = [tool for tool in tools if shutil.which(tool, path=SBIN) is None]
    if missing:
        pytest.skip(
            f"Slurm is not installed here ({', '.join(missing)} not found); apt-get install slurm-wlm"
        )


def gpu_devices(directory: Path) -> Path:
    """``directory/dev/nvidia0..7``: stand-ins for a GPU node's device files (module docstring)."""
    devices = directory / "dev"
    devices.mkdir()
    for index in range(8):
        os.mknod(devices / f"nvidia{index}", 0o644 | stat.S_IFCHR, os.makedev(1, 3))
    return devices


def write_conf(
    directory: Path,
    *,
    cluster: str,
    controller: tuple[str, str],
    nodes: Sequence[tuple[str, str]],
    ports: tuple[int, int] = (6817, 6818),
    proctrack: str = "proctrack/linuxproc",
    cpus: int = 8,
) -> str:
    """Write ``directory/slurm.conf`` and ``gres.conf`` (8 GPUs a node) and return slurm.conf's text.

    ``controller`` and ``nodes`` are (name, address); each node claims ``cpus`` CPUs
    (``config_overrides``), so an allocation and a job of its own fit side by side on 2 cores.
    Makes the state and spool directories (``spool-<node>``)."""
    (directory / "state").mkdir()
    for name, _ in nodes:
        (directory / f"spool-{name}").mkdir()
    lines = "".join(
        f"NodeName={name} NodeAddr={address} CPUs={cpus} Gres=gpu:8 State=UNKNOWN\n"
        for name, address in nodes
    )
    text = CONF.format(
        cluster=cluster, ctl=controller[0], ctl_addr=controller[1], ctld_port=ports[0], d_port=ports[1],
        user=getpass.getuser(), proctrack=proctrack, dir=directory, nodes=lines,
    )  # fmt: skip
    (directory / "slurm.conf").write_text(text)
    (directory / "gres.conf").write_text(f"Name=gpu File={gpu_devices(directory)}/nvidia[0-7]\n")
    return text


class SlurmClient:
    """Slurm's client commands against one test cluster (``env`` carries its ``SLURM_CONF``)."""

    def __init__(self, directory: Path, env: Mapping[str, str]) -> None:
        self.dir = directory
        self.conf = directory / "slurm.conf"
        self.env = dict(env)

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def jobs(self) -> list[str]:
        return self.run("squeue", "--noheader", "--format=%A %j %T").stdout.splitlines()

    def steps(self) -> list[str]:
        return self.run("squeue", "--noheader", "--steps", "--format=%i %j").stdout.splitlines()

    def wait_until(self, check: Callable[[], bool], seconds: float = 15.0) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if check():
                return True
            time.sleep(0.2)
        return bool(check())

    def wait_idle(self, nodes: int, seconds: float) -> bool:
        """Every one of the ``nodes`` nodes idle within ``seconds``."""
        want = f"idle {nodes}"
        return self.wait_until(lambda: self.run("sinfo", "-h", "-o", "%t %D").stdout.strip() == want, seconds)

    def log(self, name: str, lines: int = 15) -> str:
        """The last ``lines`` of a log in the cluster's directory."""
        try:
            return "\n".join((self.dir / name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def start_daemon(argv: list[str], env: Mapping[str, str], out: Path) -> subprocess.Popen:
    """A daemon in the foreground in a session of its own, its output in ``out``."""
    with open(out, "wb") as handle:
        return subprocess.Popen(
            argv, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )


def pids_with_env(needle: str) -> list[int]:
    """Processes whose environment holds ``needle`` (``SLURM_CONF=<ours>``), never this one."""
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


def stop(procs: Sequence[subprocess.Popen], client: SlurmClient | None, conf: Path) -> None:
    """Cancel every job, stop the daemons, kill whatever still carries ``SLURM_CONF=conf``."""
    if client is not None:
        with contextlib.suppress(Exception):
            client.run("scancel", f"--user={getpass.getuser()}", timeout=10)
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # slurmstepd and ranks daemonize away from slurmd: find them by the SLURM_CONF they carry.
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids_with_env(f"SLURM_CONF={conf}"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        end = time.monotonic() + 3
        while pids_with_env(f"SLURM_CONF={conf}") and time.monotonic() < end:
            time.sleep(0.1)
