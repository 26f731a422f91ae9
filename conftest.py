"""The repository's own test configuration (users of the plugin never load this)."""

# pytester's in-process runs snapshot sys.modules and drop what a run imported first; numpy (pulled in
# by the report's matplotlib plots) cannot be imported twice in one process, so import it up front.
import matplotlib

matplotlib.use("Agg")
import matplotlib.figure
import numpy  # noqa: F401

pytest_plugins = ["pytester"]
