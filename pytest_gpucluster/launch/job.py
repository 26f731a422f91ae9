"""`Cluster`: run a workload on N ranks and get a `JobResult` back.

``cluster.run("pkg.mod:func", nodes=2, env=nccl_env, timeout=120)`` makes a job directory
under the results directory, writes ``job.json`` (the contract in `workloads._runtime`), asks
the launcher backend for its commands, runs them through `launch.process` (deadline, tree
kill, no orphans) and reads back what every rank wrote. ``cluster.commands_for(...)`` builds
the same commands and starts nothing (``--gpucluster-dry-run``).

Job directories are kept: a failed job's report prints the path of its per-rank logs. On real
multi-node clusters the results directory must be on a filesystem every node sees (the ranks
write their files into it).

No torch, no pytest.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import re
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_gpucluster.cluster.ports import next_port
from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.errors import LaunchError, SettingsError
from pytest_gpucluster.launch.base import (
    JobSpec,
    LaunchCommand,
    Launcher,
    RemoteExec,
    current_pythonpath_entry,
    is_local_host,
    merge_pythonpath,
)
from pytest_gpucluster.launch.forward_env import DEFAULT_PATTERNS, forwarded_env
from pytest_gpucluster.launch.guard import guard_argv
from pytest_gpucluster.launch.job_files import read_rank_states
from pytest_gpucluster.launch.leftovers import SessionTag
from pytest_gpucluster.launch.process import LaunchSpec, run_commands
from pytest_gpucluster.launch.reaper import reap_argv
from pytest_gpucluster.launch.result import JobResult, build_result
from pytest_gpucluster.launch.xdist import launch_lock
from pytest_gpucluster.workloads._runtime import JOB_FILE, JOB_ID_ENV, SESSION_ENV, write_json_atomic

COMMANDS_FILE = "commands.json"
"""In the job directory: ``[{"host", "argv"}]``, the launcher's commands as they were started."""

__all__ = [
    "COMMANDS_FILE",
    "RANK_DEADLINE_GRACE_S",
    "RENDEZVOUS_BASE_S",
    "RENDEZVOUS_PER_NODE_S",
    "Cluster",
    "guarded",
    "rendezvous_deadline",
    "workload_name",
]

Workload = str | Callable[..., Any]
RANK_DEADLINE_GRACE_S = 30.0
"""How long after the job's timeout a rank still running ends itself (see `workloads._worker`):
long enough for the controller's own kill, with its stack dumps, to come first."""
RENDEZVOUS_BASE_S = 120.0
"""How long the ranks of a one-node job get to start (``--rendezvous-timeout``): imports, and on
real sites container start-up and a shared filesystem's cold attribute caches."""
RENDEZVOUS_PER_NODE_S = 2.0
"""Added per node beyond the first: agents start one by one through ssh/pdsh, and the rendezvous
store answers every node (a 64-node job gets 246 s, a 512-node job 1142 s)."""


def rendezvous_deadline(nnodes: int, base_s: float = RENDEZVOUS_BASE_S) -> float:
    """Seconds the ranks of an ``nnodes``-node job get to start and meet."""
    return base_s + RENDEZVOUS_PER_NODE_S * max(nnodes - 1, 0)


def workload_name(workload: Workload) -> tuple[str, list[str]]:
    """``("pkg.mod:func", [sys.path roots the ranks need])`` for a name or a function object."""
    if isinstance(workload, str):
        module, _, func = workload.partition(":")
        if not module or not func:
            raise SettingsError(f"workload {workload!r} is not of the form 'package.module:function'")
        return workload, []
    module = getattr(workload, "__module__", None)
    qualname = getattr(workload, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        raise SettingsError(
            f"workload {workload!r} is not importable by name: use a module-level function "
            "(ranks import it as 'package.module:function')"
        )
    if module == "__main__":
        raise SettingsError(
            f"workload {qualname} lives in __main__, which ranks cannot import; move it to a module"
        )
    roots: list[str] = []
    mod = sys.modules.get(module)
    file = getattr(mod, "__file__", None)
    if file:
        path = Path(file).resolve()
        root = path.parent if path.name != "__init__.py" else path.parent.parent
        for _ in range(module.count(".")):
            root = root.parent
        roots.append(str(root))
    return f"{module}:{qualname}", roots


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:40] or "job"


class Cluster:
    """Launches jobs on the hosts of a `ClusterSpec` through one launcher backend."""

    def __init__(
        self,
        spec: ClusterSpec,
        launcher: Launcher,
        results_dir: str | Path,
        remote_exec: RemoteExec | str | Sequence[str] | None = None,
        progress: Callable[[str], None] | None = None,
        default_env: Mapping[str, str] | None = None,
        *,
        rendezvous_timeout: float = RENDEZVOUS_BASE_S,
        forward_env: Sequence[str] = DEFAULT_PATTERNS,
        failure_grace: float = 5.0,
        python: str | None = None,
        session_tag: str | None = None,
        rank_deadline_grace: float = RANK_DEADLINE_GRACE_S,
    ) -> None:
        self.spec = spec
        self.launcher = launcher
        self.results_dir = Path(results_dir)
        if remote_exec is not None and not isinstance(remote_exec, RemoteExec):
            remote_exec = RemoteExec.parse(remote_exec)
        self.remote_exec = remote_exec
        self.progress = progress
        self.default_env = dict(default_env or {})
        self.rendezvous_timeout = rendezvous_timeout
        """The start-up deadline of a one-node job; `rendezvous_deadline` adds per node."""
        self.forward_env = tuple(forward_env)
        """Patterns of this process's variables every job carries (`launch.forward_env`)."""
        self.failure_grace = failure_grace
        self.python = python or sys.executable
        # Jobs carry the session that launched them, so a later session can tell its leftovers.
        self.session_tag = session_tag or os.environ.get(SESSION_ENV) or str(SessionTag.of_process())
        self.rank_deadline_grace = rank_deadline_grace

    def __repr__(self) -> str:
        return (
            f"Cluster({self.spec.nnodes} node(s) x {self.spec.nproc_per_node} from {self.spec.source}, "
            f"{self.spec.backend}, {self.launcher.name})"
        )

    # ------------------------------------------------------------------ building a job

    def _hosts(self, nodes: int | Sequence[str] | None) -> tuple[str, ...]:
        names = self.spec.host_names
        if nodes is None:
            return names
        if isinstance(nodes, int):
            if not 1 <= nodes <= len(names):
                raise LaunchError(
                    f"a job asked for {nodes} node(s) but the cluster from {self.spec.source} "
                    f"has {len(names)}: {', '.join(names)}"
                )
            return names[:nodes]
        chosen = tuple(nodes)
        unknown = [h for h in chosen if h not in names]
        if unknown or not chosen:
            raise LaunchError(
                f"a job asked for host(s) {', '.join(unknown) or '(none)'} that the cluster from "
                f"{self.spec.source} does not have ({', '.join(names)})"
            )
        return chosen

    def job_spec(
        self,
        workload: Workload,
        *,
        nodes: int | Sequence[str] | None = None,
        nproc_per_node: int | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 120.0,
        options: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> JobSpec:
        target, roots = workload_name(workload)
        hosts = self._hosts(nodes)
        far = [h for h in hosts if not is_local_host(h)]
        # srun, mpirun and the DeepSpeed runner reach the nodes themselves.
        if far and self.remote_exec is None and not getattr(self.launcher, "reaches_hosts", False):
            raise LaunchError(
                f"a job on {', '.join(hosts)} needs a remote-exec prefix to reach {', '.join(far)} "
                "(e.g. 'ssh {host}', 'pdsh -w {host}' or 'srun'); none was configured"
            )
        if timeout <= 0:
            raise SettingsError(f"a job timeout must be positive, got {timeout}")
        stamp = _dt.datetime.now().strftime("%H%M%S")
        job_id = f"{_slug(name or target.rpartition(':')[2])}-{stamp}-{uuid.uuid4().hex[:6]}"
        job_env = {**forwarded_env(self.forward_env), **self.default_env, **(env or {})}
        job_env[JOB_ID_ENV] = job_id
        job_env[SESSION_ENV] = self.session_tag
        job_env["PYTHONPATH"] = merge_pythonpath(current_pythonpath_entry(), *roots)
        return JobSpec(
            job_id=job_id,
            job_dir=(self.results_dir / job_id).resolve(),
            workload=target,
            hosts=hosts,
            nproc_per_node=nproc_per_node or self.spec.nproc_per_node,
            backend=self.spec.backend,
            env=job_env,
            timeout_s=float(timeout),
            rendezvous_port=next_port() if len(hosts) > 1 else None,
            rendezvous_timeout_s=min(
                rendezvous_deadline(len(hosts), self.rendezvous_timeout), float(timeout)
            ),
            remote=self.remote_exec,
            users=self.spec.user_map,
            python=self.python,
            options=dict(options or {}),
        )

    def commands_for(self, workload: Workload, **kwargs: Any) -> list[LaunchCommand]:
        """The commands ``run`` would start, per host; nothing is launched or written."""
        return self.launcher.commands(self.job_spec(workload, **kwargs))

    # ------------------------------------------------------------------ running it

    def run(
        self,
        workload: Workload,
        *,
        nodes: int | Sequence[str] | None = None,
        nproc_per_node: int | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 120.0,
        options: Mapping[str, Any] | None = None,
        name: str | None = None,
        init_process_group: bool = True,
        pick_device: bool = True,
        check: bool = True,
    ) -> JobResult:
        """Run ``workload`` (``"pkg.mod:func"`` or a module-level function) on every rank.

        With ``check=True`` (the default) a job that did not succeed on every rank raises:
        `JobFailed` with the root-cause report (first failing rank and host, exception and
        traceback tail, hung ranks with their stacks, log paths; ``.result`` holds the
        `JobResult`), or `JobSkipped` when every rank that reported skipped or succeeded (the
        plugin turns that into a pytest skip). A test that forgets to look at the result still
        fails. ``check=False`` returns the `JobResult` whatever happened, for tests that study
        failures. `LaunchError` means nothing could be started. ``pick_device=False``: the ranks
        take no GPU (the per-node probe reads every GPU of its node and must run where none is).
        """
        __tracebackhide__ = True  # a failed job's report is the message, not the launcher's frames
        reason = self.launcher.available()
        if reason is not None:
            raise LaunchError(f"the {self.launcher.name} launcher cannot be used here: {reason}")
        job = self.job_spec(
            workload, nodes=nodes, nproc_per_node=nproc_per_node, env=env, timeout=timeout,
            options=options, name=name,
        )  # fmt: skip
        job.job_dir.mkdir(parents=True, exist_ok=False)
        self._write_job_file(job, env, init_process_group=init_process_group, pick_device=pick_device)
        prepare = getattr(self.launcher, "prepare", None)
        if prepare is not None:  # files the commands name (hostfiles), written into the job dir
            prepare(job)
        commands = self.launcher.commands(job)
        # What was launched, as argv lists (never the environment's values): a job's own record of
        # its command line, e.g. the GPU request srun was given (docs/how-to/slurm.md).
        write_json_atomic(
            job.job_dir / COMMANDS_FILE, [{"host": c.host, "argv": list(c.argv)} for c in commands]
        )
        cancels, reapers = self._cleanup_commands(job, commands)
        launch = LaunchSpec(
            job_id=job.job_id,
            job_dir=job.job_dir,
            world_size=job.world_size,
            timeout_s=job.timeout_s,
            rendezvous_timeout_s=job.rendezvous_timeout_s + 10.0 if job.nnodes > 1 else job.timeout_s,
            failure_grace_s=self.failure_grace,
        )
        # Under pytest-xdist, multi-rank jobs of different workers must not overlap (they would
        # share devices and ports); outside xdist the lock does nothing.
        with launch_lock(self.results_dir):
            outcome = run_commands(
                launch, guarded(commands, job, cancels), progress=self.progress, reap_commands=reapers
            )
        result = build_result(
            job_id=job.job_id,
            job_dir=job.job_dir,
            world_size=job.world_size,
            nproc_per_node=job.nproc_per_node,
            hosts=[c.host for c in commands],
            commands=commands,
            process=outcome,
            states=read_rank_states(job.job_dir),
            timeout_s=job.timeout_s,
        )
        return result.raise_on_failure() if check else result

    def _write_job_file(
        self, job: JobSpec, env: Mapping[str, str] | None, *, init_process_group: bool, pick_device: bool
    ) -> None:
        """job.json: what every rank reads at start-up (workload, options, deadlines, its env)."""
        # Forwarded variables reach the ranks through the launcher; job.json, which stays in the
        # results directory, keeps only what the job itself sets (no HF_TOKEN copied to disk).
        own = {**self.default_env, **(env or {})}
        user_env = {
            k: v
            for k, v in job.env.items()
            if k not in (JOB_ID_ENV, SESSION_ENV, "PYTHONPATH") and (k in own or k not in os.environ)
        }
        write_json_atomic(
            job.job_dir / JOB_FILE,
            {
                "job_id": job.job_id,
                "workload": job.workload,
                "options": dict(job.options),
                "backend": job.backend,
                "timeout_s": job.timeout_s,
                "hard_deadline_s": job.timeout_s + self.rank_deadline_grace,
                "env": user_env,
                "init_process_group": init_process_group,
                "pick_device": pick_device,
                "hosts": list(job.hosts),
                "nproc_per_node": job.nproc_per_node,
            },
        )

    def _cleanup_commands(
        self, job: JobSpec, commands: Sequence[LaunchCommand]
    ) -> tuple[list[LaunchCommand], list[LaunchCommand]]:
        """(cancels, reapers): the launcher's cancel (scancel stops the job on every node), and
        what stops the job on each remote node whose processes this machine cannot see (the
        cancels included)."""
        reapers = [
            LaunchCommand(
                host=c.host,
                argv=tuple(job.remote.wrap(c.host, reap_argv(job.python, job.job_id), {})),
                remote=True,
            )
            for c in commands
            if c.remote and job.remote is not None and not job.remote.shares_proc
        ]
        cancel = getattr(self.launcher, "cancel_commands", None)
        cancels = list(cancel(job)) if cancel is not None else []
        return cancels, reapers + cancels


def guarded(
    commands: Sequence[LaunchCommand], job: JobSpec, on_orphan: Sequence[LaunchCommand] = ()
) -> list[LaunchCommand]:
    """Each command under a guard (`launch.guard`) that ends the job if this process dies.

    A command for this machine gets a guard here that watches this process by pid and, once it
    is gone, runs ``on_orphan`` (the Slurm cancel). A remote command gets its guard on the far
    side of the prefix, watching the stdin pipe that `launch.process` keeps open.
    """
    out = []
    for command in commands:
        if command.remote and job.remote is not None and command.node_argv:
            far = [*guard_argv(job.python, job.job_id), *command.node_argv]
            argv = job.remote.wrap(command.host, far, command.env, user=job.users.get(command.host))
        else:
            near = guard_argv(
                job.python, job.job_id, watch_pid=os.getpid(), on_orphan=[c.argv for c in on_orphan]
            )
            argv = [*near, *command.argv]
        out.append(dataclasses.replace(command, argv=tuple(argv)))
    return out
