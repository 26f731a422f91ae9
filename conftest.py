"""The repository's own test configuration (users of the plugin never load this).

pytester's in-process runs (``runpytest_inprocess``) snapshot ``sys.modules`` and, after each run,
drop every module first imported inside it. Most modules survive being imported again; C extensions
that keep process-wide state do not: a second ``import torch`` (or numpy) in one process leaves the
first copy's objects to the garbage collector, which later segfaults — at the next collection, or at
``gc_collect_harder`` when the pytest process (an xdist worker) unconfigures. An in-process run
imports torch whenever the session's fingerprint reads CUDA versions (a machine that reports CUDA),
or a test imports ``torch.distributed``. So everything a run may import that must not be imported
twice is imported here, once, before any run: torch, numpy and matplotlib's Agg path (the report's
plots). hypothesis is here only because re-importing it costs seconds per run.
"""

import contextlib
import importlib

import matplotlib

matplotlib.use("Agg")
for _name in (
    "numpy",
    "torch",
    "matplotlib.figure",
    "matplotlib.ticker",
    "matplotlib.backends.backend_agg",
    "hypothesis",
):
    with contextlib.suppress(ImportError):
        importlib.import_module(_name)

pytest_plugins = ["pytester"]
