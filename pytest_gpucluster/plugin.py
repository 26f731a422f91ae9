"""pytest hooks of pytest-gpucluster: options, markers, session start, skips, header, summary.

Hook glue only: the work lives in options/, session/, fixtures.py, results/ and launch/.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Generator
from typing import Any

import pytest

from pytest_gpucluster import fixtures as _fixtures
from pytest_gpucluster.errors import GpuClusterError, JobFailed, JobSkipped, LaunchError
from pytest_gpucluster.options import add_options, resolve_settings
from pytest_gpucluster.results.model import Measurement, TestOutcome
from pytest_gpucluster.results.recorder import NotMeasured, ThresholdFailure
from pytest_gpucluster.results.text import failure_message
from pytest_gpucluster.session import SESSION_KEY, GpuClusterSession
from pytest_gpucluster.session.start import judge_nodes, probe_nodes, start_session

_MEASUREMENT_PROPERTY = "gpucluster_measurement"
_RELEVANT_PROPERTY = "gpucluster_test"
_FIXTURES = frozenset(
    {
        "hw",
        "machine",
        "nodes",
        "cluster",
        "hostfile",
        "nccl_env",
        "results",
        "process_group",
        "gpucluster_session",
    }
)


def _uses_gpucluster(item: pytest.Item) -> bool:
    """Only tests that use the plugin's fixtures or markers count in results.json and the summary."""
    if set(getattr(item, "fixturenames", ())) & _FIXTURES:
        return True
    return any(item.get_closest_marker(name) is not None for name in ("gpucluster", "world_size", "burnin"))


MARKERS = (
    "gpucluster(min_nodes=1, min_gpus_per_node=0, needs=[...]): run only where the nodes provide this (as the "
    "per-node probe found them; slurm and mpi: the launching machine); otherwise skip naming the node and what "
    "is missing. needs: cuda, nccl, nvml, nvlink, ib, roce, efa, slurm, mpi, multi-node",
    "world_size(n): run this test body on n ranks through the launcher (use the process_group fixture)",
    "burnin: burn-in tier: long load, soak, pairwise localization, DCGM level 3; select with -m burnin",
    "quick: quick tier: per node, no inter-node traffic, a few minutes; select with -m quick",
    "standard: standard tier: the default acceptance run; select with -m standard",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    if config.option.help or config.option.version or getattr(config.option, "markers", False):
        return
    try:
        settings = resolve_settings(config)
        session = start_session(config, settings)
    except GpuClusterError as exc:
        raise pytest.UsageError(f"gpucluster: {exc}") from None
    session.verbose = config.get_verbosity() > 0
    config.stash[SESSION_KEY] = session
    _sigterm_stops_like_ctrl_c(config)
    _start_regression_gate(session)
    session.progress = _terminal_writer(config)
    config.pluginmanager.register(_ResultsHooks(session), "gpucluster-results")
    config.pluginmanager.register(_JobSkipsSkipTheTest(), "gpucluster-job-skips")
    config.pluginmanager.register(_PreflightStops(), "gpucluster-preflight")
    config.pluginmanager.register(_fixtures, "gpucluster-fixtures")
    from pytest_gpucluster import rank_tests

    if not config.pluginmanager.is_registered(rank_tests):
        config.pluginmanager.register(rank_tests, "gpucluster-rank-tests")
    # world_size(n) tests launch through the session's cluster (built on first use).
    config.stash[rank_tests.CLUSTER_KEY] = lambda: session.cluster


def _start_regression_gate(session: GpuClusterSession) -> None:
    """Every pytest process (xdist workers too) gates the values it records against --baseline;
    a rank of a world_size test reports to its parent, which gates."""
    from pytest_gpucluster.rank_tests import on_rank_side

    if session.settings.baseline is None or on_rank_side():
        return
    try:  # an unreadable baseline fails now, not after an hour of measurements
        session.start_gate(session.read_baseline())
    except GpuClusterError as exc:
        raise pytest.UsageError(f"gpucluster: --baseline: {exc}") from None


def _sigterm_stops_like_ctrl_c(config: pytest.Config) -> None:
    """SIGTERM (a CI timeout, kill, Slurm) takes Ctrl-C's path: the job is stopped and cancelled,
    fixtures are torn down, results.json is written (see sigterm.py). Not on the ranks."""
    from pytest_gpucluster.rank_tests import on_rank_side
    from pytest_gpucluster.sigterm import sigterm_as_keyboard_interrupt

    restore = None if on_rank_side() else sigterm_as_keyboard_interrupt()
    if restore is not None:
        config.add_cleanup(restore)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Before any test: report (and with --gpucluster-reap, kill) what crashed sessions left, then
    probe every node once (one short job; pytest-xdist workers, started after this hook, read
    its ``probe.json``)."""
    gc = session.config.stash.get(SESSION_KEY, None)
    if gc is None:
        return
    if gc.is_xdist_worker:  # the controller's facts, judged alike: the worker launches on the same nodes
        if not session.config.option.collectonly:
            judge_nodes(gc)
        return
    scan: threading.Thread | None = None
    failed: list[BaseException] = []
    if not gc.settings.dry_run:
        if gc.settings.reap or session.config.option.collectonly:
            gc.check_leftovers(kill=gc.settings.reap)  # reaped before the probe reads the GPUs
        else:
            # Only a report: it runs beside the probe, so a node that never answers costs the
            # probe's deadline once, not the scan's 30 s wait for it first, then the deadline.
            def report_leftovers() -> None:
                try:
                    gc.check_leftovers(kill=False)
                except BaseException as exc:  # raised here, after the probe, as it was before
                    failed.append(exc)

            scan = threading.Thread(target=report_leftovers, name="gpucluster-leftovers", daemon=True)
            scan.start()
    try:
        if not session.config.option.collectonly:
            probe_nodes(gc)
    finally:
        if scan is not None:
            scan.join()
    if failed:
        raise failed[0]
    if not session.config.option.collectonly:
        judge_nodes(gc)  # the preflight, then the usable nodes split from the rest (session/start.py)


def _terminal_writer(config: pytest.Config) -> Any:
    """A callable that writes a line to the terminal even while pytest captures test output:
    rank 0's progress (step, s/it, ETA; sweep rows) must be seen while a long job runs."""

    def write(line: str) -> None:
        capman = config.pluginmanager.getplugin("capturemanager")
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is None:
            print(line, file=sys.stderr, flush=True)
            return
        if capman is not None:
            with capman.global_and_fixture_disabled():
                reporter.write_line(f"    {line}")
        else:
            reporter.write_line(f"    {line}")

    return write


_SLOW_DESELECTED = pytest.StashKey[int]()


def _slow_burnin(item: pytest.Item) -> bool:
    return any(mark.kwargs.get("slow") for mark in item.iter_markers("burnin"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tiers' rules (plans/tiers.py), before ``-m`` deselects (tryfirst), in every xdist worker
    alike: the slow burn-in parts (``burnin(slow=True)``: the pairwise localization, about n/2 + 2
    jobs) run only when ``-m`` names burnin; every other test is in the standard tier, the quick
    ones included, so ``-m standard`` selects what a plain run does."""
    if "burnin" not in (config.getoption("markexpr", "") or ""):
        slow = [item for item in items if _slow_burnin(item)]
        if slow:
            items[:] = [item for item in items if not _slow_burnin(item)]
            config.hook.pytest_deselected(items=slow)
            config.stash[_SLOW_DESELECTED] = len(slow)
    for item in items:
        if not _slow_burnin(item) and item.get_closest_marker("standard") is None:
            item.add_marker(pytest.mark.standard)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    count = config.stash.get(_SLOW_DESELECTED, 0)
    if not count:
        return []
    return [
        f"gpucluster: {count} slow burn-in test(s) deselected (pairwise localization); run them with -m burnin"
    ]


def pytest_collection_finish(session: pytest.Session) -> None:
    """The plan of the selected tests (session/plan.py), before any test runs: results.json keeps it;
    a dry run prints it as a table with its totals; ``--gpucluster-budget`` refuses a session whose
    estimate exceeds it, naming the jobs that cost most."""
    gc = session.config.stash.get(SESSION_KEY, None)
    if gc is None or gc.is_xdist_worker or session.config.option.collectonly:
        return
    if not (gc.settings.dry_run or gc.settings.budget is not None or session.items):
        return
    from pytest_gpucluster.session.plan import dry_run_lines, session_plan

    plan, errors = session_plan(list(session.items), gc)
    gc.recorder.header["plan"] = plan.to_json()
    write = gc.progress or print
    if gc.settings.dry_run:
        for line in dry_run_lines(plan, errors, verbose=session.config.get_verbosity() > 0):
            write(line)
    budget = gc.settings.budget
    if budget is not None and plan.total_s() > budget:
        from pytest_gpucluster.plans.session_plan import over_budget

        raise pytest.UsageError(f"gpucluster: {over_budget(plan, budget, gc.settings.source('budget'))}")


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash.get(SESSION_KEY, None)
    from pytest_gpucluster.session.header import header_lines

    return header_lines(session) if session else []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    session = item.config.stash.get(SESSION_KEY, None)
    if session is None:
        return
    session.recorder.current_test = item.nodeid
    missing = session.unmet_requirements(item)
    if missing:
        pytest.skip("; ".join(missing))


class _PreflightStops:
    """A preflight error stops the session after collection and before any test launches a job:
    one failed outcome lists every finding (results.json, summary, report). A class, registered in
    pytest_configure, so that it sits beside the module's own pytest_runtestloop wrapper."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        gc = session.config.stash.get(SESSION_KEY, None)
        if gc is None or gc.is_xdist_worker or gc.settings.dry_run or session.config.option.collectonly:
            return None
        from pytest_gpucluster.session.set_aside import stop_outcome

        outcome = stop_outcome(gc.split)
        if outcome is None:
            return None
        gc.recorder.add_outcome(outcome)
        session.testsfailed = max(session.testsfailed, 1)
        return True


class _JobSkipsSkipTheTest:
    """A job whose ranks skipped (no CUDA there, no NVML...) skips the test, whether a fixture or the
    test body launched it, with the ranks' reason: `Cluster.run` raises `JobSkipped`, and this is the
    one place that turns it into a pytest skip."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from _skip_on_job_skipped())

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from _skip_on_job_skipped())


def _skip_on_job_skipped() -> Generator[None, None, None]:
    try:
        return (yield)
    except JobSkipped as exc:
        # Reported at the test's location, not this hook's.
        raise pytest.skip.Exception(str(exc), _use_item_location=True) from None


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> None:
    """A `job_part` fixture whose job failed fails its test here, in the call phase, with the job's
    report (which ranks, on which hosts, their tracebacks); the test function does not run."""
    failure = pyfuncitem.stash.get(_fixtures.JOB_FAILURE, None)
    if failure is not None:
        # The report is the whole story; a traceback through pytest's hook wrappers would bury it.
        pytest.fail(f"JobFailed: {failure}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    session = item.config.stash.get(SESSION_KEY, None)
    if session is None:
        return report
    relevant = _uses_gpucluster(item)
    if relevant and not any(name == _RELEVANT_PROPERTY for name, _ in report.user_properties):
        report.user_properties.append((_RELEVANT_PROPERTY, "1"))
    if call.when != "call":
        return report
    # Measurements travel on the report: pytest-xdist sends them to the controller, and JUnit XML
    # shows them as properties.
    for m in session.recorder.measurements:
        if m.test_id == item.nodeid:
            report.user_properties.append((_MEASUREMENT_PROPERTY, json.dumps(m.to_json())))
    if call.excinfo is not None:
        job_failed = _fixtures.JOB_FAILURE in item.stash
        category = "infrastructure" if job_failed else _category(call.excinfo)
        report.gpucluster_category = category  # type: ignore[attr-defined]
    return report


def _category(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    if excinfo.errisinstance(ThresholdFailure):  # RegressionFailure too
        return "performance"
    if excinfo.errisinstance(NotMeasured):
        return "not measured"
    if excinfo.errisinstance((JobFailed, LaunchError)):
        return "infrastructure"
    if excinfo.errisinstance(pytest.skip.Exception):
        return "skipped"
    return "failure"


class _ResultsHooks:
    """Hooks that need the session: registered in pytest_configure with it bound."""

    def __init__(self, session: GpuClusterSession) -> None:
        self.session = session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        recorder = self.session.recorder
        if self.session.is_xdist_worker:
            return
        from_worker = hasattr(report, "node")
        if from_worker and report.when == "call":
            for name, payload in report.user_properties:
                if name == _MEASUREMENT_PROPERTY:
                    recorder.measurements.append(Measurement.from_json(json.loads(payload)))
        if not any(name == _RELEVANT_PROPERTY for name, _ in report.user_properties):
            return
        if (
            report.when == "call"
            or (report.when == "setup" and not report.passed)
            or (report.when == "teardown" and report.failed)
        ):
            recorder.add_outcome(_outcome(report))


def _outcome(report: pytest.TestReport) -> TestOutcome:
    if report.skipped:
        category = "skipped"
        message = (
            str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr or "")
        )
    elif report.passed:
        category, message = "pass", ""
    else:
        category = getattr(report, "gpucluster_category", None) or _category_from_text(report)
        crash = getattr(report.longrepr, "reprcrash", None)
        text = report.longreprtext.strip()
        message = crash.message if crash is not None else (text.splitlines()[-1] if text else "")
    outcome = report.outcome if report.when == "call" else ("error" if report.failed else report.outcome)
    return TestOutcome(
        test_id=report.nodeid,
        outcome=outcome,  # type: ignore[arg-type]
        category=category,  # type: ignore[arg-type]
        duration_s=round(report.duration, 3),
        message=message[:2000],
    )


def _category_from_text(report: pytest.TestReport) -> str:
    text = report.longreprtext or ""
    if "ThresholdFailure" in text or "RegressionFailure" in text:
        return "performance"
    if "NotMeasured" in text:
        return "not measured"
    if "JobFailed" in text or "LaunchError" in text:
        return "infrastructure"
    return "failure"


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, object, object]:
    """With ``--gpucluster-retest-suspects``, once every test ran: the tests that named a node to
    drain run again on those nodes only (``results/retest.py``)."""
    result = yield
    gc = session.config.stash.get(SESSION_KEY, None)
    if (
        gc is not None
        and gc.settings.retest_suspects
        and not gc.is_xdist_worker
        and not gc.settings.dry_run
        and not (session.shouldstop or session.shouldfail)
    ):
        from pytest_gpucluster.session.retest import retest_suspects

        retest_suspects(session, gc)
    return result


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Baseline gate and report files, in the controller, before the terminal summary prints."""
    gc = session.config.stash.get(SESSION_KEY, None)
    if gc is None or gc.is_xdist_worker or not (gc.recorder.outcomes or gc.recorder.measurements):
        return
    from pytest_gpucluster.results.report import finish_run

    if _fail_closed(gc) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if gc.split is not None and gc.split.set_aside and session.exitstatus == 0:  # measured without them
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if gc.settings.history is not None:
        from pytest_gpucluster.results.history.session_end import add_history_column

        add_history_column(gc.settings.history, gc.hosts, gc.recorder)

    failed = any(o.category != "pass" and o.outcome in ("failed", "error") for o in gc.recorder.outcomes)
    mode = "warn" if gc.settings.regression_gate == "warn" else "fail"
    finished = finish_run(
        gc.recorder, gc.results_dir, gc.baseline, gc.tolerances, mode=mode, tests_failed=failed
    )
    gc.finished = finished
    if finished.comparison is not None and finished.comparison.fails and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if gc.settings.history is not None:
        from pytest_gpucluster.results.history.session_end import append_run

        gc.history_line = append_run(gc.settings.history, gc.recorder)
    if gc.settings.drain:
        from pytest_gpucluster.burnin.drain import SUSPECTS_FILE, drain_listed

        gc.drain_lines = drain_listed(gc.results_dir / SUSPECTS_FILE)


def _fail_closed(gc: GpuClusterSession) -> bool:
    """Every threshold the profile sets was measured, excused by a skip, or not run in this
    selection (``checks/fail_closed.py``); the rest fail here, as NOT MEASURED. True when any did."""
    from pytest_gpucluster.checks.fail_closed import FAIL_CLOSED_TEST_ID, Inventory, coverage

    if gc.settings.dry_run:
        return False  # a dry run launches nothing: it plans, and judges no threshold
    model = gc.profile.model
    soak = bool(gc.settings.soak) or bool(gc.tier is not None and gc.tier.soak_s)
    # set-aside nodes are named once by their own finding (session/set_aside.py), not NOT MEASURED again
    inventory = Inventory.of(model, gc.usable_facts, soak=soak)
    found = coverage(model, gc.recorder.measurements, gc.recorder.outcomes, inventory)
    gc.recorder.header["thresholds"] = found.to_json()
    if not found.checks:
        return False
    recorded = gc.recorder.record_checks(found.checks, test_id=FAIL_CLOSED_TEST_ID)
    keys = ", ".join(c.ref.key for c in found.checks if c.ref is not None)
    message = "\n".join(
        [f"NotMeasured: {len(recorded)} threshold(s) of the profile had no value: {keys}"]
        + [f"  {failure_message(m)}" for m in recorded]
    )
    gc.recorder.add_outcome(TestOutcome(FAIL_CLOSED_TEST_ID, "failed", "not measured", 0.0, message[:2000]))
    return True


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None or session.is_xdist_worker:
        return
    if not session.recorder.outcomes and not session.recorder.measurements:
        return  # no test used the plugin: stay out of the way
    from pytest_gpucluster.results.summary import summary_lines

    session.recorder.flush()
    finished = session.finished
    terminalreporter.section("gpucluster summary")
    extra = finished.summary_args() if finished else {}
    lines = summary_lines(session.recorder, session.results_dir, **extra)
    retest = session.recorder.header.get("retest")
    if retest:
        from pytest_gpucluster.results.retest import retest_lines

        lines += retest_lines(retest)
    if session.history_line:
        lines.append(session.history_line)
    lines += session.drain_lines
    for line in lines:
        bad = line.startswith(
            (
                "FAILED",
                "REGRESSION",
                "PERFORMANCE",
                "INFRASTRUCTURE",
                "OTHER",
                "FAIL ",
                "FINDINGS",
                "NOT MEASURED",
                "BROKEN",
                "SIGN-OFF NOT FIT",
                "SIGN-OFF NO RESULTS",
            )
        )
        fit = line.startswith("SIGN-OFF FIT")
        terminalreporter.write_line(
            line, red=bad, green=fit, bold=line.startswith("SIGN-OFF"), yellow=line.startswith("WARNING")
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if (
        session is not None
        and not session.is_xdist_worker
        and (session.recorder.outcomes or session.recorder.measurements)
    ):
        try:
            session.recorder.flush()
        except OSError as exc:  # a full disk must not hide the test results
            print(f"gpucluster: could not write {session.recorder.path}: {exc}", file=sys.stderr)
