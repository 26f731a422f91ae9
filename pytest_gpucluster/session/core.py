"""The session object: owns the resolved settings, the profile, the detected machine, the
cluster handle, the per-node facts, the results recorder and the baseline. `session.start`
builds one per pytest process from the stages of the session's start (spec, probe, choose,
preflight, set aside); `plugin.py` keeps it under `SESSION_KEY`; fixtures and acceptance modules
read it with `get_session`.

The nodes are judged on what the per-node probe found on them (`cluster.probe`), never on the
machine pytest runs on, which is usually a login node without GPUs. The stages below it are plain
functions of plain values; this module imports them, never the modules above it (`session.plan`,
`session.header`, `session.retest`, `session.start`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gpucluster.cluster.node_facts import ClusterFacts
from pytest_gpucluster.errors import GpuClusterError, SettingsError
from pytest_gpucluster.options import Settings
from pytest_gpucluster.plans.tiers import TierDurations
from pytest_gpucluster.profiles.detect import MachineInfo
from pytest_gpucluster.profiles.loader import LoadedProfile
from pytest_gpucluster.results.recorder import Recorder
from pytest_gpucluster.session.probe import all_local, allocation_cpus
from pytest_gpucluster.session.set_aside import NodeSplit
from pytest_gpucluster.session.spec import NodeList

if TYPE_CHECKING:
    from pytest_gpucluster.cluster.preflight import PreflightFinding
    from pytest_gpucluster.launch.leftover_check import LeftoverReport
    from pytest_gpucluster.results.baseline import RunResults
    from pytest_gpucluster.results.gate import Tolerances
    from pytest_gpucluster.results.report import Finished


@dataclass
class GpuClusterSession:
    settings: Settings
    machine: MachineInfo
    profile: LoadedProfile
    profile_reason: str
    results_dir: Path
    recorder: Recorder
    nodes: NodeList
    """The nodes the session was given (`session.spec`)."""
    is_xdist_worker: bool = False
    baseline: RunResults | None = None
    """The ``--baseline`` results file, read at start-up (an unreadable one is a usage error)."""
    finished: Finished | None = None
    """The report files and baseline comparison, once the session has finished."""
    session_tag: str = ""
    """``host:pid:start`` of the pytest that owns this run (an xdist worker's parent): every job
    carries it, so a later session can tell this run's leftovers from a live run's jobs."""
    leftovers: LeftoverReport | None = None
    """What `check_leftovers` found at session start, or None."""
    probed: ClusterFacts | None = None
    """The per-node probe's facts once taken (or read from the controller's ``probe.json``)."""
    not_probed: str | None = None
    """Why the nodes were not probed (a dry run), for skip reasons and the header."""
    preflight: list[PreflightFinding] | None = None
    """The preflight's findings on the probed nodes (`session.preflight`); None when not judged."""
    split: NodeSplit | None = None
    """The nodes the session runs on, and whether it stops before launch (`session.set_aside`)."""
    history_line: str = ""
    """What appending this run to ``--gpucluster-history`` did, for the summary."""
    drain_lines: list[str] = field(default_factory=list)
    """What ``--gpucluster-drain`` did at the end of the session (`burnin.drain.drain_listed`)."""
    tier: TierDurations | None = None
    """The run's tier (``-m quick|standard|burnin``, `plans.tiers`) and its durations."""
    verbose: bool = False
    """``-v``: a dry run prints every command with its environment."""
    history_baseline: str = ""
    """With ``--baseline history:N``: which stored runs the baseline is the median of."""
    only_hosts: tuple[str, ...] = ()
    """While suspects are retested: the nodes the session's cluster is narrowed to (`retest_on`)."""

    def keep_facts(self, facts: ClusterFacts) -> None:
        """Hold the probe's facts: results.json's header, ``probe.json`` for the xdist workers, the
        Slurm launcher's CPUs per node."""
        from pytest_gpucluster.cluster.probe import PROBE_FILE
        from pytest_gpucluster.workloads._runtime import write_json_atomic

        self.probed = facts
        self.recorder.header["nodes"] = facts.to_json()
        if self.baseline is not None and self.recorder.gate is not None:
            # The gate started before the probe: now it can also name a link or port that changed.
            self.start_gate(self.baseline)
        # A job's facts are left for the xdist workers; a local reading they take themselves
        # (cheap), so that a session of plain tests leaves no results directory behind.
        if not self.is_xdist_worker and facts.source.startswith("probe job"):
            self.results_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.results_dir / PROBE_FILE, facts.to_json())
        cpus = [n.cpus for n in facts.nodes if n.cpus]
        launcher = getattr(self.__dict__.get("cluster"), "launcher", None)
        if cpus and hasattr(launcher, "cpus_per_node"):  # --cpus-per-task sized to the smallest node
            launcher.cpus_per_node = min(cpus)

    @property
    def node_facts(self) -> ClusterFacts | None:
        """The nodes' facts: probed here, or the controller's ``probe.json`` (xdist workers, ranks)."""
        if self.probed is None and self.is_xdist_worker:
            from pytest_gpucluster.cluster.probe import probe_here, probe_options, read_probe_file

            self.probed = read_probe_file(self.results_dir)
            if self.probed is None and (
                all_local(self.hosts) or os.environ.get("GPUCLUSTER_RANK_SIDE") == "1"
            ):
                self.probed = probe_here(probe_options(self.forward_patterns))
        return self.probed

    @property
    def usable_facts(self) -> ClusterFacts | None:
        """The probed facts of the usable nodes only (those set aside left out): what capability
        marks are judged on."""
        facts = self.node_facts
        if facts is None or self.split is None:
            return facts
        usable = {h.split(".")[0] for h in self.split.usable}
        kept = tuple(n for n in facts.nodes if n.host.split(".")[0] in usable)
        return replace(facts, nodes=kept) if kept else facts

    @property
    def forward_patterns(self) -> tuple[str, ...]:
        """The variables every job carries: the defaults, ``--forward-env``, the profile's."""
        from pytest_gpucluster.launch.forward_env import forward_patterns

        return forward_patterns(self.settings.forward_env, self.profile.model.launch.forward_env)

    @property
    def probe_deadline(self) -> float:
        """Each node's probe job: a one-node start-up (``--rendezvous-timeout``) and the probe's work."""
        from pytest_gpucluster.cluster.probe import PROBE_WORK_S
        from pytest_gpucluster.launch.job import rendezvous_deadline

        return rendezvous_deadline(1, self.settings.rendezvous_timeout) + PROBE_WORK_S

    @property
    def rendezvous_deadline(self) -> float:
        from pytest_gpucluster.launch.job import rendezvous_deadline

        return rendezvous_deadline(max(len(self.hosts), 1), self.settings.rendezvous_timeout)

    @cached_property
    def tolerances(self) -> Tolerances:
        """The regression gate's tolerances: the profile's ``regression:`` globs, first match wins,
        then ``--max-regression``."""
        from pytest_gpucluster.results.gate import ToleranceRule, Tolerances

        model = self.profile.model
        rules = tuple(
            ToleranceRule(
                t.metric, t.tolerance, f"profile {model.name}: regression.tolerances[{i}]", t.healthy_spread
            )
            for i, t in enumerate(model.regression.tolerances)
        )
        source = f"--max-regression, {self.settings.source('max_regression')}"
        return Tolerances(self.settings.max_regression, source, rules)

    def read_baseline(self) -> RunResults:
        """The ``--baseline`` results file, or with ``history:N`` the median of the last N healthy
        runs of this profile in the ``--gpucluster-history`` store."""
        from pytest_gpucluster.options.gate import HistoryRuns
        from pytest_gpucluster.results.baseline import read_results

        wanted = self.settings.baseline
        if not isinstance(wanted, HistoryRuns):
            return read_results(Path(str(wanted)))
        if self.settings.history is None:
            raise SettingsError(
                f"{wanted} takes the baseline from the run history: name the store with "
                "--gpucluster-history PATH (or GPUCLUSTER_HISTORY)"
            )
        from pytest_gpucluster.results.history.baseline import read_history_baseline

        found = read_history_baseline(self.settings.history, wanted.last, self.profile.name)
        self.history_baseline = found.summary()
        return found.results

    def start_gate(self, baseline: RunResults) -> None:
        """Gate every value this process records against ``baseline`` (`Recorder.check_all`)."""
        from pytest_gpucluster.results.regression import RegressionGate

        self.baseline = baseline
        mode = "warn" if self.settings.regression_gate == "warn" else "fail"
        self.recorder.gate = RegressionGate.start(baseline, self.recorder.header, self.tolerances, mode)

    @cached_property
    def nccl_env(self) -> dict[str, str]:
        """The profile's NCCL environment; the user's own ``NCCL_*`` variables win."""
        env = dict(self.profile.model.nccl_env)
        env.update({k: v for k, v in os.environ.items() if k.startswith("NCCL_")})
        return env

    @property
    def hostfile(self) -> Any:
        """The parsed ``--hostfile`` (None without one); one that cannot be read raises its error."""
        if self.nodes.error is not None:
            raise self.nodes.error
        return self.nodes.hostfile

    @property
    def hosts(self) -> list[str]:
        """The nodes jobs run on: the usable ones (`usable_hosts`), narrowed to the suspects while
        they are retested."""
        hosts = self.usable_hosts
        return [h for h in hosts if h in self.only_hosts] if self.only_hosts else hosts

    @property
    def usable_hosts(self) -> list[str]:
        """The nodes given (``--gpucluster-exclude`` left out), without those the set-aside stage
        set aside (`session.set_aside`); a hostfile that cannot be read raises its error."""
        _ = self.hostfile
        usable = self.split.usable if self.split is not None else None
        return [h for h in self.nodes.hosts if usable is None or h in usable]

    def narrow_to_usable(self, split: NodeSplit) -> None:
        """Keep the set-aside stage's split: jobs launched from now on run on its usable nodes only."""
        self.split = split
        self.__dict__.pop("cluster", None)

    def retest_on(self, hosts: tuple[str, ...]) -> None:
        """Narrow the session's cluster to ``hosts`` (the suspects to retest); () widens it again.
        Jobs launched from now on run on those nodes only."""
        self.only_hosts = hosts
        self.__dict__.pop("cluster", None)

    @property
    def available_nodes(self) -> int:
        requested = self.settings.nnodes
        return min(requested, len(self.hosts)) if requested else len(self.hosts)

    @property
    def ranks_per_node(self) -> int:
        return self.settings.nproc_per_node or self.profile.model.cluster.effective_ranks_per_node

    @property
    def backend(self) -> str:
        return self.profile.model.cluster.backend

    progress: Callable[[str], None] | None = None
    """Where rank 0's progress lines go (the terminal, set by the plugin)."""

    @cached_property
    def cluster(self) -> Any:
        """The launch handle for this session: hosts from --hostfile, a Slurm allocation or this machine."""
        from pytest_gpucluster.cluster.spec import ClusterSpec
        from pytest_gpucluster.launch import get_launcher
        from pytest_gpucluster.launch.job import Cluster

        launcher_name = self.settings.launcher
        if self.hostfile is not None:
            spec = ClusterSpec.from_hostfile(self.hostfile, self.ranks_per_node, self.backend)
        elif launcher_name == "slurm" and os.environ.get("SLURM_JOB_NODELIST"):
            # The allocation's nodes, at the session's ranks per node (as with a hostfile): a login
            # shell under salloc has no SLURM_GPUS_ON_NODE and often no tasks per node.
            allocation = ClusterSpec.from_slurm_env(backend=self.backend)
            rpn = self.ranks_per_node
            spec = replace(
                allocation, hosts=tuple((h, rpn) for h in allocation.host_names), nproc_per_node=rpn
            )
        else:
            spec = ClusterSpec.from_local(self.ranks_per_node, self.backend)
        keep = set(self.hosts)
        if not self.nodes.local and len(keep) < spec.nnodes:  # this machine alone: nothing to narrow
            spec = replace(spec, hosts=tuple(h for h in spec.hosts if h[0] in keep))
        nnodes = self.settings.nnodes
        if nnodes and nnodes < spec.nnodes:
            spec = replace(spec, hosts=spec.hosts[:nnodes])
        return Cluster(
            spec,
            get_launcher(launcher_name, **self._launcher_kwargs(launcher_name)),
            self.results_dir / "jobs",
            remote_exec=self.settings.remote_exec,
            progress=self.progress,
            default_env=self.nccl_env,
            session_tag=self.session_tag,
            rendezvous_timeout=self.settings.rendezvous_timeout,
            forward_env=self.forward_patterns,
        )

    def check_leftovers(self, *, kill: bool) -> None:
        """Look for what crashed sessions left on this machine and the hostfile's nodes (through
        the remote-exec prefix); with ``kill``, reap it. Reported in the header and results.json."""
        from pytest_gpucluster.launch.base import RemoteExec
        from pytest_gpucluster.launch.leftover_check import check_leftovers

        hostfile = None if self.cluster_error() else self.hostfile  # a bad one fails the tests that use it
        hosts = [(e.host, e.user) for e in hostfile.entries] if hostfile is not None else []
        remote = self.settings.remote_exec
        self.leftovers = check_leftovers(
            hosts, RemoteExec.parse(remote) if remote else None, sys.executable, self.session_tag, kill=kill
        )
        if not self.leftovers.empty:
            self.recorder.header["leftovers"] = self.leftovers.to_json()

    def _launcher_kwargs(self, name: str) -> dict[str, Any]:
        extra = self.settings.launcher_args
        kwargs: dict[str, Any] = {}
        if extra:
            if name == "torchrun":
                raise SettingsError("--launcher-args is for slurm, mpirun and deepspeed; torchrun takes none")
            kwargs["extra_args"] = list(extra)
        if name == "slurm":
            cluster = self.profile.model.cluster
            kwargs.update(
                mode=self.settings.slurm_mode,
                device=cluster.device,
                gpus_per_node=cluster.gpus_per_node or None,
                gpu_request=self.profile.model.launch.slurm_gpu_request,
                cpu_bind=self.settings.slurm_cpu_bind,
                cpus_per_node=allocation_cpus(),
            )
        return kwargs

    def unmet_requirements(self, item: pytest.Item) -> list[str]:
        """Each requirement of the item's ``gpucluster`` markers this session does not meet, as a sentence."""
        missing: list[str] = []
        machine = self.machine
        for mark in item.iter_markers("gpucluster"):
            min_nodes = int(mark.kwargs.get("min_nodes", 1))
            if self.available_nodes < min_nodes:
                where = (
                    f"hostfile {self.settings.hostfile}"
                    if self.hostfile
                    else "local machine only; pass --hostfile"
                )
                missing.append(f"needs {min_nodes} nodes, the cluster has {self.available_nodes} ({where})")
            min_gpus = int(mark.kwargs.get("min_gpus_per_node", 0))
            needs = tuple(mark.kwargs.get("needs", ()))
            facts = self.usable_facts
            if facts is not None:  # judged on the usable nodes, never on this (login) machine
                missing += facts.unmet(min_gpus=min_gpus, needs=needs)
            for need in needs:
                if need == "multi-node":
                    if self.available_nodes < 2:
                        missing.append(
                            "needs multi-node: the cluster has 1 node (pass --hostfile with 2+ hosts)"
                        )
                elif need in ("slurm", "mpi") and need not in machine.capabilities:
                    missing.append(f"needs {need}: {machine.why_missing(need)}")
        return missing

    def cluster_error(self) -> GpuClusterError | None:
        """Why a cluster handle cannot be built (bad hostfile...), or None."""
        try:
            _ = self.hostfile
        except GpuClusterError as exc:
            return exc
        return None


SESSION_KEY = pytest.StashKey[GpuClusterSession]()


def get_session(config: pytest.Config) -> GpuClusterSession:
    """The session `plugin.py` started for ``config``; a usage error if the plugin did not start."""
    try:
        return config.stash[SESSION_KEY]
    except KeyError:
        raise pytest.UsageError("gpucluster: the plugin did not start (see the error above)") from None
