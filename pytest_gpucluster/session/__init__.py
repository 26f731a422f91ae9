"""The session: its object (`core`) and its start, one module per stage, each a function of the
previous stage's value (`start` runs them in order):

    spec -> probe -> choose -> preflight -> set_aside -> plan

``header`` (the report header and results.json's header) and ``retest`` (the suspects' retest
after the main loop) read the started session. With `plugin.py` and `fixtures.py`, the only
modules that import pytest. Nothing below ``session/`` imports it (``results/`` included).
"""

from pytest_gpucluster.session.core import SESSION_KEY, GpuClusterSession, get_session

__all__ = ["SESSION_KEY", "GpuClusterSession", "get_session"]
