"""The collective sweep for real: torchrun + the rank worker + gloo on 2 ranks, small sizes.

Each launch is about 3-5 s on a 2-core machine (torch import and gloo set-up); the sweeps
themselves take well under a second. Later these jobs go through ``cluster.run``; for now the
test writes ``job.json`` and starts torchrun itself, exactly as the launcher will.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_gpucluster.maths.sweep import layout, summarize_sweep, sweep_sizes
from pytest_gpucluster.parsers.nccl_tests import parse

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = "pytest_gpucluster.workloads.collectives:sweep"
SMALL = {"min_bytes": 1024, "max_bytes": "1M", "factor": 32, "warmup": 2, "iters": 5}


def run_sweep(job_dir: Path, options: dict[str, Any], nproc: int = 2, timeout_s: float = 90) -> list[dict]:
    """Launch the worker like the plugin will; return every rank's record (all must be ok)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    job = {"workload": WORKLOAD, "options": options, "backend": "gloo", "timeout_s": timeout_s}
    (job_dir / "job.json").write_text(json.dumps(job))
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    argv += ["-m", "pytest_gpucluster.workloads._worker", str(job_dir)]
    proc = subprocess.run(argv, env=env, cwd=job_dir, capture_output=True, text=True, timeout=timeout_s)
    records = []
    for rank in range(nproc):
        path = job_dir / f"rank-{rank}.json"
        assert path.exists(), f"rank {rank} wrote no result (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
        record = json.loads(path.read_text())
        log = (job_dir / f"rank-{rank}.log").read_text()[-3000:]
        assert record["status"] == "ok", f"rank {rank}: {record.get('error') or record}\n{log}"
        records.append(record)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return records


def progress_text(job_dir: Path) -> str:
    """rank 0's progress lines without their ``HH:MM:SS `` stamps."""
    return "".join(line[9:] for line in (job_dir / "progress.log").read_text().splitlines(keepends=True))


def test_all_reduce_sweep_measures_checks_and_prints_nccl_tests_table(tmp_path):
    records = run_sweep(tmp_path / "job", {**SMALL, "collective": "all_reduce", "repeat": 2})
    values = [r["value"] for r in records]
    expected_sizes = sweep_sizes(1024, 1 << 20, 32)
    assert expected_sizes == [1024, 32768, 1048576]

    for rank, value in enumerate(values):
        assert (value["rank"], value["nranks"], value["collective"]) == (rank, 2, "all_reduce")
        assert [p["size_bytes"] for p in value["points"]] == expected_sizes
        assert [p["count"] for p in value["points"]] == [s // 4 for s in expected_sizes]
        for point in value["points"]:
            for placement in ("out_of_place", "in_place"):
                cell = point[placement]
                assert cell["wrong"] == 0
                assert len(cell["times_us"]) == 2 and all(t > 0 for t in cell["times_us"])

    points = summarize_sweep(values)
    assert [(p.size_bytes, p.in_place) for p in points] == [
        (s, ip) for s in expected_sizes for ip in (False, True)
    ]
    assert all(p.wrong == 0 and p.busbw_spread.n == 2 for p in points)
    for p in points:  # 2 ranks: all_reduce's bus factor 2(n-1)/n is 1
        assert p.busbw_gbs == pytest.approx(p.algbw_gbs) == pytest.approx(p.size_bytes / p.time_us / 1e3)
    # 1000x the bytes at a latency-bound start: bandwidth must grow with size, noise or not.
    by_size = {p.size_bytes: p for p in points if not p.in_place}
    assert by_size[1 << 20].busbw_gbs > 5 * by_size[1024].busbw_gbs

    # What rank 0 streamed is an nccl-tests table our own parser reads back.
    text = progress_text(tmp_path / "job")
    assert "# Avg bus bandwidth" in text and "# Out of bounds values : 0 OK" in text
    [run] = parse(text)
    assert (run.collective, run.nranks, run.nnodes) == ("all_reduce", 2, 1)
    assert [r.size_bytes for r in run.rows] == expected_sizes
    assert all(r.dtype == "float" and r.redop == "sum" and r.root == -1 for r in run.rows)
    assert all(r.out_of_place.wrong == 0 and r.in_place.wrong == 0 for r in run.rows)


def test_all_gather_sizes_follow_nccl_tests(tmp_path):
    """Size is the whole gathered buffer and count the per-rank count, aligned to 16 bytes."""
    options = {**SMALL, "collective": "all_gather", "min_bytes": 1000, "max_bytes": 40000, "factor": 40}
    values = [r["value"] for r in run_sweep(tmp_path / "job", options)]
    # 1000 B of float32 = 250 elements -> 125 per rank -> 124 (a multiple of 4) -> 992 B in all.
    assert [(p["size_bytes"], p["count"]) for p in values[0]["points"]] == [(992, 124), (40000, 5000)]
    assert [(p["size_bytes"], p["count"]) for p in values[1]["points"]] == [(992, 124), (40000, 5000)]
    for value in values:
        for point in value["points"]:
            assert point["out_of_place"]["wrong"] == 0 and point["in_place"]["wrong"] == 0
    points = summarize_sweep(values)
    assert all(p.busbw_gbs == pytest.approx(p.algbw_gbs / 2) for p in points)  # (n-1)/n at n=2


def test_check_counts_corrupted_elements_on_the_damaged_rank(tmp_path):
    """alltoall with rank 1's result damaged: 3 wrong elements per size, all on rank 1; in place
    there is nothing to check (nccl-tests prints N/A)."""
    options = {**SMALL, "collective": "alltoall", "corrupt_rank": 1, "corrupt_elements": 3}
    values = [r["value"] for r in run_sweep(tmp_path / "job", options)]
    assert [(p["size_bytes"], p["count"]) for p in values[0]["points"]] == [
        (layout("alltoall", s, 4, 2).size_bytes, layout("alltoall", s, 4, 2).count)
        for s in (1024, 32768, 1 << 20)
    ]
    assert [p["out_of_place"]["wrong"] for p in values[0]["points"]] == [0, 0, 0]
    assert [p["out_of_place"]["wrong"] for p in values[1]["points"]] == [3, 3, 3]
    assert all(p["in_place"]["wrong"] is None for v in values for p in v["points"])
    summary = summarize_sweep(values)
    assert [p.wrong for p in summary] == [3, None] * 3
    text = progress_text(tmp_path / "job")
    assert "# Out of bounds values : 9 FAILED" in text
    assert [(r.out_of_place.wrong, r.in_place.wrong) for r in parse(text)[0].rows] == [(3, None)] * 3
