"""``@pytest.mark.world_size(n)``: run one test body on n ranks, with the ``process_group`` fixture.

In the spirit of DeepSpeed's ``DistributedTest`` (tests/unit/common.py), but through the
plugin's own launcher. In the parent, `pytest_pyfunc_call` launches a job on n ranks whose
workload, `run_test_on_rank`, runs ``pytest.main([<this test>])`` inside every rank with
``GPUCLUSTER_RANK_SIDE=1``. There the hook does nothing, the test body runs, and
``process_group`` yields the default group the worker already joined. Each rank reports its
outcome (passed / failed / skipped / xfailed + the report text); the parent fails naming the
failing rank(s) with their report, skips if a rank skipped (with its reason), and turns a
crash or hang of the job into the launcher's failure report.

The test's fixtures are set up in the parent too (as with ``DistributedTest``), where
``process_group`` is None: keep fixtures of rank tests cheap, or request them only on ranks.

Register with ``config.pluginmanager.register(rank_tests, "gpucluster-rank-tests")`` (guard it
with ``is_registered``); the parent gets its `Cluster` from `get_cluster`, which the plugin
points at the session's cluster with ``config.stash[CLUSTER_KEY] = cluster`` (a `Cluster`, or a
zero-argument callable returning one).

This module imports pytest, so it must never be imported from ``workloads/``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_gpucluster.launch.job import Cluster
from pytest_gpucluster.workloads._runtime import RankContext

__all__ = [
    "CLUSTER_KEY",
    "RANK_SIDE_ENV",
    "get_cluster",
    "on_rank_side",
    "process_group",
    "pytest_configure",
    "pytest_pyfunc_call",
    "run_test_on_rank",
]

RANK_SIDE_ENV = "GPUCLUSTER_RANK_SIDE"
"""Set to ``1`` in every rank of a world_size test: the plugin there must not launch again."""
CLUSTER_KEY = pytest.StashKey["Cluster | Callable[[], Cluster]"]()
DEFAULT_TIMEOUT_S = 120.0
WORKLOAD = "pytest_gpucluster.rank_tests:run_test_on_rank"
MARKER = "world_size(n, timeout=120): run this test body on n ranks (use the process_group fixture)"

# Command-line options of the parent that the ranks' pytest must see too (plugins, ini overrides).
_PASS_VALUE = {"-p", "-o", "--override-ini", "-c", "--config-file", "--import-mode", "--confcutdir", "-W",
               "--pythonwarnings"}  # fmt: skip
_PASS_FLAG = {"--noconftest"}


def on_rank_side() -> bool:
    return os.environ.get(RANK_SIDE_ENV) == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)


# --------------------------------------------------------------------------- parent side


def get_cluster(config: pytest.Config) -> Cluster:
    """The cluster world_size tests launch on: the plugin's, else this machine alone."""
    found = config.stash.get(CLUSTER_KEY, None)
    if found is None:
        from pytest_gpucluster.cluster.spec import ClusterSpec
        from pytest_gpucluster.launch import get_launcher

        results = tempfile.mkdtemp(prefix="gpucluster-rank-tests-")
        found = Cluster(ClusterSpec.from_local(), get_launcher("torchrun"), results)
        config.stash[CLUSTER_KEY] = found
    if not isinstance(found, Cluster):
        found = found()
        config.stash[CLUSTER_KEY] = found
    return found


def _world_size(item: pytest.Item) -> tuple[int, float]:
    marker = item.get_closest_marker("world_size")
    assert marker is not None
    size = marker.args[0] if marker.args else marker.kwargs.get("n")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.world_size needs a positive int rank count, got {size!r}"
        )
    return size, float(marker.kwargs.get("timeout", DEFAULT_TIMEOUT_S))


def _layout(cluster: Cluster, size: int) -> tuple[int, int]:
    """``(nodes, ranks per node)`` for ``size`` ranks: one node if they fit, else whole nodes."""
    per = cluster.spec.nproc_per_node
    if size <= per or cluster.spec.nnodes == 1:
        return 1, size
    if size % per == 0 and size // per <= cluster.spec.nnodes:
        return size // per, per
    raise pytest.UsageError(
        f"world_size({size}) does not fit the cluster: {cluster.spec.nnodes} node(s) of {per} ranks"
    )


def _rank_args(config: pytest.Config, item: pytest.Item) -> list[str]:
    _file_part, _, rest = item.nodeid.partition("::")
    target = f"{item.path}::{rest}" if rest else str(item.path)
    args = [target, "-p", "no:cacheprovider", "-q", f"--rootdir={config.rootpath}"]
    given = list(config.invocation_params.args)
    i = 0
    while i < len(given):
        arg = given[i]
        name = arg.split("=", 1)[0]
        if name in _PASS_VALUE and "=" not in arg and i + 1 < len(given):
            args += [arg, given[i + 1]]
            i += 2
            continue
        if (
            name in _PASS_VALUE
            or name in _PASS_FLAG
            or (arg.startswith("-p") and len(arg) > 2 and arg[2] != "-")
        ):
            args.append(arg)
        i += 1
    if config.pluginmanager.hasplugin("xdist"):
        args += ["-n", "0"]
    return args


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if pyfuncitem.get_closest_marker("world_size") is None or on_rank_side():
        return None
    config = pyfuncitem.config
    size, timeout = _world_size(pyfuncitem)
    cluster = get_cluster(config)
    nodes, per_node = _layout(cluster, size)
    job = cluster.run(
        WORKLOAD,
        nodes=nodes,
        nproc_per_node=per_node,
        env={RANK_SIDE_ENV: "1"},
        timeout=timeout,
        options={
            "args": _rank_args(config, pyfuncitem),
            "cwd": str(config.invocation_params.dir),
            "nodeid": pyfuncitem.nodeid,
        },
        name=f"ws{size}-{pyfuncitem.name}",
        check=False,  # _judge reads every rank's own pytest report
    )
    _judge(job, pyfuncitem.nodeid)
    return True


def _judge(job: Any, nodeid: str) -> None:
    """Turn the ranks' reports into this test's outcome in the parent."""
    reports = {r.rank: r.value for r in job.ranks if r.ok and isinstance(r.value, dict)}
    failed = [
        (rank, rep) for rank, rep in sorted(reports.items()) if rep.get("outcome") in ("failed", "error")
    ]
    if failed:
        blocks = []
        for rank, rep in failed:
            outcome = job.ranks[rank]
            what = "failed" if rep["outcome"] == "failed" else f"errored in {rep.get('when', 'setup')}"
            blocks.append(
                f"rank {rank} {what} (on {outcome.host}):\n{rep.get('longrepr', '').rstrip()}\n"
                f"  log: {outcome.log_path}"
            )
        names = ", ".join(str(rank) for rank, _ in failed)
        head = f"{nodeid} failed on rank{'s' if len(failed) > 1 else ''} {names} of {len(job.ranks)}"
        pytest.fail(f"{head}\n\n" + "\n\n".join(blocks) + f"\n\njob directory: {job.job_dir}", pytrace=False)
    if not job.ok and job.failures:
        pytest.fail(job.failure_report(), pytrace=False)
    skipped = [(rank, rep) for rank, rep in sorted(reports.items()) if rep.get("outcome") == "skipped"]
    skipped += [(r.rank, {"reason": r.reason}) for r in job.ranks if r.status == "skipped"]
    if skipped:
        rank, rep = skipped[0]
        _skip(f"skipped on rank {rank}: {rep.get('reason') or 'no reason given'}")
    not_run = [rank for rank, rep in reports.items() if rep.get("outcome") == "not-run"]
    if not_run:
        pytest.fail(
            f"{nodeid}: the ranks' pytest did not run this test (rank {not_run[0]} collected nothing for it); "
            f"see {job.ranks[not_run[0]].log_path}",
            pytrace=False,
        )
    if reports and all(rep.get("outcome") == "xfailed" for rep in reports.values()):
        pytest.xfail(reports[min(reports)].get("reason") or "")
    if not job.ok:  # e.g. processes survived the kill
        pytest.fail(job.failure_report(), pytrace=False)


def _skip(reason: str) -> None:
    """pytest.skip, reported at the test's location rather than at this hook's."""
    try:
        exc = pytest.skip.Exception(reason, _use_item_location=True)  # type: ignore[call-arg]
    except TypeError:  # a pytest without that keyword
        pytest.skip(reason)
    raise exc


# --------------------------------------------------------------------------- rank side


@pytest.fixture
def process_group(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The default process group this rank joined (torch.distributed); None in the parent."""
    if request.node.get_closest_marker("world_size") is None:
        pytest.fail(
            f"{request.node.nodeid} uses the process_group fixture without @pytest.mark.world_size(n): "
            "mark it so that it runs on n ranks",
            pytrace=False,
        )
    if not on_rank_side():
        yield None
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        pytest.fail("process_group: the rank did not join a process group", pytrace=False)
    yield dist.group.WORLD


class _RankReporter:
    """Collects the reports of the one test a rank's pytest runs."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.reports: list[Any] = []
        self.collect_error: str | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        import pytest_gpucluster.rank_tests as module

        manager = session.config.pluginmanager
        if not manager.is_registered(module) and manager.get_plugin(module.__name__) is None:
            manager.register(module, module.__name__)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed and self.collect_error is None:
            self.collect_error = str(report.longreprtext)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.append(report)

    def summary(self) -> dict[str, Any]:
        if self.collect_error is not None and not self.reports:
            return {"outcome": "error", "when": "collect", "longrepr": self.collect_error}
        if not self.reports:
            return {"outcome": "not-run"}
        captured = []
        for rep in self.reports:
            captured += [f"--- {name} ---\n{text}" for name, text in rep.sections if text]
        for rep in self.reports:
            if rep.failed:
                outcome = "failed" if rep.when == "call" else "error"
                return {"outcome": outcome, "when": rep.when, "longrepr": str(rep.longreprtext),
                        "captured": captured}  # fmt: skip
            if rep.skipped:
                if hasattr(rep, "wasxfail"):
                    return {"outcome": "xfailed", "when": rep.when, "reason": rep.wasxfail}
                reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
                return {
                    "outcome": "skipped",
                    "when": rep.when,
                    "reason": str(reason).removeprefix("Skipped: "),
                }
        call = next((rep for rep in self.reports if rep.when == "call"), None)
        if call is not None and hasattr(call, "wasxfail"):
            return {"outcome": "xpassed", "when": "call", "reason": call.wasxfail}
        return {"outcome": "passed", "duration_s": sum(rep.duration for rep in self.reports)}


def run_test_on_rank(ctx: RankContext) -> dict[str, Any]:
    """The workload of a world_size job: run the one test with pytest inside this rank."""
    args = [str(a) for a in ctx.options["args"]]
    reporter = _RankReporter(str(ctx.options.get("nodeid", "")))
    os.environ[RANK_SIDE_ENV] = "1"
    os.chdir(ctx.options.get("cwd") or os.getcwd())
    pytest.main(args, plugins=[reporter])
    return {"rank": ctx.rank, **reporter.summary()}
