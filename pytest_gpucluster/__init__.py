"""pytest-gpucluster: acceptance tests that tell whether a GPU cluster is fit for training.

Nothing heavy is imported here: rank-side workers import ``pytest_gpucluster.workloads``
through this package, and ``pytest --help`` must stay fast.
"""

__version__ = "0.1.0"
