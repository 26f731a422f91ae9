"""Loaded by every Python started with this directory on PYTHONPATH (the launch forwards it to the
ranks): with ``GPUCLUSTER_STANDIN_CUDA=1``, a rank's node probe reports a CUDA torch that can use
the GPUs its recorded ``nvidia-smi`` lists, as `cuda_torch_standin` does in the pytest process.
``GPUCLUSTER_STANDIN_VISIBLE=<host>=<list>`` gives that node's ranks ``CUDA_VISIBLE_DEVICES``, as a
scheduler (or a site's prolog) would. Nothing else changes: a launched workload still finds no GPU,
unless ``GPUCLUSTER_STANDIN_CUDA_RANKS=1`` also gives its torch the GPUs that the stand-in NVML
(``standin_nvml/pynvml.py``) describes (`cuda_torch_standin_ranks`).
"""

import os
import socket

if os.environ.get("GPUCLUSTER_STANDIN_CUDA") == "1":
    host, _, visible = os.environ.get("GPUCLUSTER_STANDIN_VISIBLE", "").partition("=")
    if host and host == socket.gethostname():
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    from cuda_torch_standin_view import install

    install()

if os.environ.get("GPUCLUSTER_STANDIN_CUDA_RANKS") == "1":
    # a rank's torch sees the GPUs the stand-in NVML describes (cuda_torch_standin_ranks.py)
    from cuda_torch_standin_ranks import install as install_ranks

    install_ranks()
