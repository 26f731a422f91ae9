"""Single-device tests under pytest-xdist: each worker gets its own slice of the node's GPUs."""

import pytest

from pytest_gpucluster.profiles import detect

SOURCE = """
import os

def test_slice(local_devices):
    print("SLICE", os.environ.get("CUDA_VISIBLE_DEVICES"), local_devices)
"""


@pytest.fixture
def eight_gpus(monkeypatch):
    fake = detect.MachineInfo(hostname="node0", cuda_available=True, gpu_names=("NVIDIA H100 80GB HBM3",) * 8)
    monkeypatch.setattr(detect, "detect_machine", lambda: fake)
    monkeypatch.setattr("pytest_gpucluster.session.start.detect_machine", lambda: fake)


@pytest.mark.parametrize(("worker", "expected"), [("gw0", "0,1,2,3"), ("gw1", "4,5,6,7")])
def test_each_xdist_worker_owns_its_slice(pytester, tmp_path, monkeypatch, eight_gpus, worker, expected):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makepyfile(test_demo=SOURCE)
    result = pytester.runpytest_inprocess("-s", "--hw=dgx-h100-ib", f"--results-dir={tmp_path / 'r'}")
    result.stdout.fnmatch_lines([f"*SLICE {expected} [[]0, 1, 2, 3]"])
    import os

    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # restored after the test


def test_without_xdist_every_gpu(pytester, tmp_path, monkeypatch, eight_gpus):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.makepyfile(test_demo=SOURCE)
    result = pytester.runpytest_inprocess("-s", "--hw=dgx-h100-ib", f"--results-dir={tmp_path / 'r'}")
    result.stdout.fnmatch_lines(["*SLICE None [[]0, 1, 2, 3, 4, 5, 6, 7]"])
