"""Options naming files and directories a run reads or writes besides the profile: where results
go, existing NCCL and training logs to check instead of launching, and nccl-tests binaries.

Part of the option table that `options` assembles; must not import pytest.
"""

from __future__ import annotations

from pytest_gpucluster.options.spec import Option, user_path

RESULTS_DIR = Option(
    "--results-dir",
    "results_dir",
    "where results.json, reports and per-rank logs go (default: gpucluster-results/<timestamp>)",
    None,
    user_path,
    "DIR",
)
NCCL_LOG = Option(
    "--nccl-log",
    "nccl_log",
    "check an existing NCCL_DEBUG=INFO log instead of launching (repeatable, globs allowed)",
    (),
    str,
    "PATH",
    multiple=True,
)
TRAIN_LOG = Option(
    "--train-log",
    "train_log",
    "gate on an existing training log (repeatable, globs)",
    (),
    str,
    "PATH",
    multiple=True,
)
NCCL_TESTS_DIR = Option(
    "--nccl-tests-dir",
    "nccl_tests_dir",
    "directory of nccl-tests binaries (all_reduce_perf, ...) to run through the launcher",
    None,
    user_path,
    "DIR",
)
