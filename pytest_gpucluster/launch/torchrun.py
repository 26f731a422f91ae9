"""The torchrun backend: one ``torch.distributed.run`` agent per node, each starting its ranks.

- One node: ``python -m torch.distributed.run --standalone --nproc-per-node=N ...``. Standalone
  puts the c10d store on a port the kernel picks, so concurrent jobs (pytest-xdist) cannot
  collide on it (FEASIBILITY §8: fixed ports failed 3 launches in 8).
- Several nodes: every agent gets ``--nnodes=M --rdzv-backend=c10d
  --rdzv-endpoint=<first host>:<port> --rdzv-id=<job id>``. The agent whose hostname matches the
  endpoint hosts the store; no ``--node-rank`` is passed, c10d assigns node ranks.
  ``join_timeout`` bounds how long an agent waits for a node that never comes.

``--max-restarts=0``: a failed rank fails the job; the test must see it, not a silent retry.

Pure: builds argv, starts nothing, imports no torch.
"""

from __future__ import annotations

import importlib.util

from pytest_gpucluster.launch.base import JobSpec, LaunchCommand, worker_argv_tail

__all__ = ["TorchrunLauncher"]


class TorchrunLauncher:
    name = "torchrun"

    def available(self) -> str | None:
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed in this Python, so torch.distributed.run cannot start ranks"
        return None

    def agent_argv(self, job: JobSpec) -> list[str]:
        """The agent's own argv (without any remote prefix), the same on every node."""
        argv = [job.python, "-m", "torch.distributed.run"]
        if job.nnodes == 1:
            argv += ["--standalone", "--nnodes=1"]
        else:
            if job.rendezvous_port is None:
                raise ValueError(f"job {job.job_id} spans {job.nnodes} nodes but has no rendezvous port")
            argv += [
                f"--nnodes={job.nnodes}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={job.hosts[0]}:{job.rendezvous_port}",
                f"--rdzv-id={job.job_id}",
                f"--rdzv-conf=join_timeout={int(max(job.rendezvous_timeout_s, 1))}",
            ]
        argv += [f"--nproc-per-node={job.nproc_per_node}", "--max-restarts=0"]
        return argv + worker_argv_tail(job)

    def commands(self, job: JobSpec) -> list[LaunchCommand]:
        argv = self.agent_argv(job)
        commands = []
        for host in job.hosts:
            if job.needs_remote(host):
                assert job.remote is not None
                full = job.remote.wrap(host, argv, job.env, user=job.users.get(host))
                commands.append(
                    LaunchCommand(
                        host=host, argv=tuple(full), env=job.env, remote=True, node_argv=tuple(argv)
                    )
                )
            else:
                commands.append(LaunchCommand(host=host, argv=tuple(argv), env=job.env))
        return commands
