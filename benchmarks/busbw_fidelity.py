"""Does the harness's busbw mean what an independent benchmark's busbw means?

Each round runs two separate jobs, one after the other, the order alternating every round:

- the harness: the acceptance path — ``cluster.run`` of ``collectives:sweep_many`` with the
  options ``plans.collectives.job_options`` builds, one sweep per collective over the sizes
  (``-b`` smallest, ``-e`` largest, ``-f`` their common factor; ``-w --warmup``, ``-n --iters``,
  one timed span per point), read back with ``checks.collectives.collect`` — out-of-place only
  and without the ``-c`` check (in-place would double the job for numbers not compared; the
  check runs outside the timed span and the reference has none);
- the reference, launched by plain torchrun as its own job:
  ``benchmarks/reference/busbw_bench.py``, the seed-004 ``all_reduce_bench.py`` arithmetic
  (a barrier and one timed collective per trial, ``--iters`` trials after ``--warmup``,
  algbw averaged over ranks then trials) with nccl-tests' busbw factors, for all_reduce,
  all_gather and reduce_scatter. It imports nothing from this package.

With ``--nccl-tests DIR`` the reference is nccl-tests itself, for all 7 collectives: each
``DIR/<collective>_perf`` (or ``DIR/build/...``) runs once per round with ``-b -e -f -g
<GPUs> -w -n -c 0`` and its out-of-place busbw column is the reference (its output read with
``parsers.nccl_tests``). That needs CUDA and the binaries; without them the script says so and
exits 2.

Both jobs end alike: the harness's worker and the reference leave through ``os._exit`` after
destroying the process group and flushing (nccl-tests binaries end as C programs do). The end
is outside every timed span; it matters because an abort at interpreter exit (a gloo teardown
race, pytorch/pytorch#190489) would fail a reference job the harness never fails.

On CPU both sides' ranks run in the quiet condition (``--rank-sched quiet``, ``sides.rank_sched``):
rank i pinned to core i and SCHED_FIFO, and a SCHED_IDLE spinner per core so the VM's vCPUs never
halt. Without it, gloo's wake-ups wait on the host's halt polling and a collective repeated
within one job moves 6-9% (and 20-35% in a job's first seconds); with it, 2-3%, and it runs
~1.6x faster. A warm-up round runs first, unrecorded.

Per collective and size it prints the medians of both, then a line ending with the median over
rounds of the paired ratio harness/reference busbw, then its 95% confidence interval (order
statistics; ``ratio_stats``). A point whose interval is within +-2% of its median (after 6
rounds) is not measured again: later rounds run only the pending points (the harness as
one-size sweeps of the acceptance workload, the reference with ``--points``). Rounds continue
until every point settled, ``--max-rounds``, or the ``--max-seconds`` budget (default ~3
minutes). Target: every interval within [0.97, 1.03].

``--control`` runs the reference against a second job of itself in the harness's place: the
same statistics over two identical sides, the noise floor of this machine. No harness/reference
interval can be narrower than what the control reaches in the same budget.

Then, not gated, the harness over the same reference job's other readings of its collectives:
the trials' mean duration (the seed averages rates, which reads high when trials vary) and, with
``--diagnose`` (it doubles the reference's job), a span of as many collectives back to back
after one barrier (nccl-tests' timing, the harness's). Outside the quiet condition an isolated
collective ran faster than the same collective back to back on the 2-core VM (0.81-0.94 at
16 MiB in one process), so the definitions could differ there; in the quiet condition the three
readings agree within their intervals.

    python benchmarks/busbw_fidelity.py [--sizes 4M,16M,64M] [--nproc 2] [--iters 20] [--control]
    python benchmarks/busbw_fidelity.py --nccl-tests ~/nccl-tests/build [--sizes 64M,256M,1G]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ratio_stats import MedianCI, median_ci, paired_ratios
from rounds import RoundRecord, StopRule, add_stop_options, progress_line, report_lines, run_interleaved
from sides import RANK_SCHED_CHOICES, REFERENCE_DIR, REPO, local_cluster, rank_sched, run_plain_torchrun

sys.path.insert(0, str(REPO))

from pytest_gpucluster.checks.collectives import collect, human_size
from pytest_gpucluster.maths.metrics import COLLECTIVES
from pytest_gpucluster.maths.sweep import parse_size
from pytest_gpucluster.plans.collectives import WORKLOAD, SweepRequest, job_options, job_timeout
from pytest_gpucluster.profiles.schema import SweepSettings

REFERENCE = REFERENCE_DIR / "busbw_bench.py"
SEED_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
WARMUP_ROUNDS = 1
NEEDS = "busbw_fidelity --nccl-tests needs CUDA and nccl-tests binaries"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default=None,
        help="3 sizes, a geometric series (default 4M,16M,64M; 64M,256M,1G with --nccl-tests)",
    )
    parser.add_argument(
        "--collectives",
        default=None,
        help="default: the 3 the seed reference covers; all 7 with --nccl-tests",
    )
    parser.add_argument(
        "--nproc", type=int, default=None, help="ranks (default 2; every GPU with --nccl-tests)"
    )
    parser.add_argument(
        "--iters", type=int, default=20, help="timed collectives per size: harness -n, reference trials"
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed collectives first")
    parser.add_argument(
        "--control",
        action="store_true",
        help="A/A control: the reference against a second job of itself in the harness's place"
        " (this machine's noise floor; no harness runs)",
    )
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="the reference also times its trials back to back (a second reading; doubles its job)",
    )
    parser.add_argument(
        "--nccl-tests", type=Path, default=None, metavar="DIR", help="compare with nccl-tests binaries in DIR"
    )
    parser.add_argument(
        "--rank-sched",
        choices=RANK_SCHED_CHOICES,
        default=None,
        help="how both sides' ranks are scheduled (default quiet on CPU, none with --nccl-tests)",
    )
    add_stop_options(parser, max_rounds=40, max_seconds=170.0)
    return parser.parse_args(argv)


def size_grid(text: str) -> tuple[list[int], int]:
    """The sizes and their integer factor; they must be a geometric series, as nccl-tests sweeps."""
    sizes = sorted({parse_size(s) for s in text.split(",") if s.strip()})
    if not sizes or sizes[0] <= 0:
        raise SystemExit(f"--sizes {text!r}: give positive sizes such as 4M,16M,64M")
    if len(sizes) == 1:
        return sizes, 2
    factor = sizes[1] // sizes[0]
    expected = [sizes[0] * factor**i for i in range(len(sizes))]
    if factor < 2 or sizes != expected:
        raise SystemExit(
            f"--sizes {text!r}: the sweep visits -b, -b*f, -b*f^2...; give sizes with one integer factor"
            f" between them (such as 4M,16M,64M), got {[human_size(s) for s in sizes]}"
        )
    return sizes, factor


def key(collective: str, size: int) -> str:
    return f"{collective} {human_size(size)}"


# ------------------------------------------------------------------------------------ the harness


def sweep_requests(
    collectives: Sequence[str], sizes: list[int], factor: int, pending: Sequence[str] | None
) -> list[SweepRequest]:
    """The acceptance grid (one sweep per collective over every size) while every point of a
    collective is pending; one one-size sweep per point still pending once others settled."""
    requests = []
    for collective in collectives:
        wanted = [s for s in sizes if pending is None or key(collective, s) in pending]
        if wanted == sizes:
            requests.append(SweepRequest(collective, sizes[0], sizes[-1], factor))
        else:
            requests.extend(SweepRequest(collective, s, s, factor) for s in wanted)
    return requests


class Harness:
    """One ``cluster.run`` of the acceptance sweep per call, over the points still pending."""

    def __init__(
        self,
        args: argparse.Namespace,
        collectives: Sequence[str],
        sizes: list[int],
        factor: int,
        backend: str,
        results_dir: Path,
    ) -> None:
        self.cluster = local_cluster(args.nproc, backend, results_dir)
        self.collectives, self.sizes, self.factor, self.backend = collectives, sizes, factor, backend
        self.settings = SweepSettings(
            min_bytes=sizes[0],
            max_bytes=sizes[-1],
            factor=factor,
            warmup=args.warmup,
            iters=args.iters,
            check=False,
        )

    def __call__(self, pending: Sequence[str] | None = None) -> dict[str, float]:
        requests = sweep_requests(self.collectives, self.sizes, self.factor, pending)
        options = job_options(requests, self.settings, repeat=1)
        for sweep in options["sweeps"]:
            sweep["in_place"] = False
        timeout = job_timeout(requests, self.settings, 1, self.backend)
        job = self.cluster.run(WORKLOAD, timeout=timeout, options=options, name="busbw-fidelity")
        data = collect(job.values)
        out: dict[str, float] = {}
        for collective, got in data.items():
            if got.skipped:
                raise SystemExit(f"the harness skipped {collective}: {got.skipped}")
            for point in got.points:
                if not point.in_place and (pending is None or key(collective, point.size_bytes) in pending):
                    out[key(collective, point.size_bytes)] = point.busbw_gbs
        return out


# ---------------------------------------------------------------------------------- the references


class SeedReference:
    """One plain-torchrun job of ``reference/busbw_bench.py`` per call, over the points pending."""

    def __init__(
        self, args: argparse.Namespace, collectives: Sequence[str], sizes: list[int], work_dir: Path
    ) -> None:
        self.out = work_dir / "reference.json"
        self.nproc = args.nproc
        self.points = [(c, s) for c in collectives for s in sizes]
        self.argv = [
            "--trials", str(args.iters), "--warmup", str(args.warmup), "--backend", "gloo", "--out", str(self.out),
            *(["--span"] if args.diagnose else []),
        ]  # fmt: skip
        self.diagnostics: dict[str, dict[str, list[float]]] = {"busbw_mean_time_gbs": {}}
        if args.diagnose:
            self.diagnostics["busbw_span_gbs"] = {}
        """Per diagnostic, per key, per call (warm-up first): the reference's other readings."""

    def __call__(self, pending: Sequence[str] | None = None) -> dict[str, float]:
        self.out.unlink(missing_ok=True)
        points = [f"{c}:{s}" for c, s in self.points if pending is None or key(c, s) in pending]
        run_plain_torchrun(REFERENCE, self.nproc, [*self.argv, "--points", ",".join(points)])
        results = json.loads(self.out.read_text())["results"]
        for name, per_key in self.diagnostics.items():
            for r in results:
                per_key.setdefault(key(r["collective"], r["size_bytes"]), []).append(r[name])
        return {key(r["collective"], r["size_bytes"]): r["busbw_gbs"] for r in results}


class NcclTestsReference:
    """Each nccl-tests binary once per call, single process driving every GPU (``-g``)."""

    def __init__(
        self,
        args: argparse.Namespace,
        binaries: Mapping[str, Path],
        sizes: list[int],
        factor: int,
        work_dir: Path,
    ) -> None:
        self.binaries, self.work_dir = binaries, work_dir
        self.tail = ["-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", str(factor), "-g", str(args.nproc),
                     "-w", str(args.warmup), "-n", str(args.iters), "-c", "0", "-d", "float", "-o", "sum"]  # fmt: skip

    def __call__(self, pending: Sequence[str] | None = None) -> dict[str, float]:
        """Each binary whose collective has a point pending runs its whole range (one launch);
        only the pending points are returned."""
        from pytest_gpucluster.parsers.nccl_tests import parse

        out: dict[str, float] = {}
        for collective, binary in self.binaries.items():
            if pending is not None and not any(k.startswith(f"{collective} ") for k in pending):
                continue
            argv = [str(binary), *self.tail]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            log = self.work_dir / f"{collective}.log"
            log.write_text(done.stdout + done.stderr)
            if done.returncode != 0:
                raise SystemExit(f"{' '.join(argv)} exited with {done.returncode}; its output is in {log}")
            for run in parse(done.stdout, str(log)):
                for row in run.rows:
                    wanted = pending is None or key(collective, row.size_bytes) in pending
                    if row.out_of_place is not None and wanted:
                        out[key(collective, row.size_bytes)] = row.out_of_place.busbw_gbs
        return out


def nccl_tests_binaries(directory: Path, collectives: Sequence[str]) -> dict[str, Path] | str:
    """``collective -> binary``, or what is missing (the script then says it cannot run)."""
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        gpus = 0
    if gpus < 2:
        return f"{NEEDS}: this machine has {gpus} CUDA GPU(s); busbw needs at least 2 ranks"
    found, missing = {}, []
    for collective in collectives:
        candidates = [directory / f"{collective}_perf", directory / "build" / f"{collective}_perf"]
        hit = next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)
        if hit is None:
            missing.append(f"{collective}_perf")
        else:
            found[collective] = hit
    if missing:
        return f"{NEEDS}: no executable {', '.join(missing)} in {directory} (nor in its build/)"
    return found


# ----------------------------------------------------------------------------------------- main


def _progress(record: RoundRecord, cis: Mapping[str, MedianCI]) -> None:
    ratios = " ".join(f"{record.harness[k] / record.reference[k]:.3f}" for k in record.harness)
    print(progress_line(record, cis, f"per-key ratios {ratios}"), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    nccl = args.nccl_tests is not None
    collectives = (args.collectives or ",".join(COLLECTIVES if nccl else SEED_COLLECTIVES)).split(",")
    unknown = sorted(set(collectives) - set(COLLECTIVES if nccl else SEED_COLLECTIVES))
    if unknown:
        covered = COLLECTIVES if nccl else SEED_COLLECTIVES
        raise SystemExit(f"--collectives: {unknown} not covered here; choose from {', '.join(covered)}")
    sizes, factor = size_grid(args.sizes or ("64M,256M,1G" if nccl else "4M,16M,64M"))
    rule = StopRule.from_args(args)
    if nccl and args.control:
        raise SystemExit(
            "--control runs the seed reference against itself; it does not combine with --nccl-tests"
        )
    if nccl:
        binaries = nccl_tests_binaries(args.nccl_tests, collectives)
        if isinstance(binaries, str):
            print(binaries)
            return 2
        import torch

        args.nproc = args.nproc or torch.cuda.device_count()
    args.nproc = args.nproc or 2
    if args.nproc < 2:
        raise SystemExit(f"--nproc {args.nproc}: busbw needs at least 2 ranks (its factor is 0 for one)")

    sched = rank_sched(args.rank_sched or ("none" if nccl else "quiet"))
    with sched as sched_line, tempfile.TemporaryDirectory(prefix="busbw-fidelity-") as tmp:
        work = Path(tmp)
        harness: Any
        if args.control:
            (work / "control").mkdir()
            harness = SeedReference(args, collectives, sizes, work / "control")
        else:
            harness = Harness(args, collectives, sizes, factor, "nccl" if nccl else "gloo", work / "jobs")
        reference: Any = (
            NcclTestsReference(args, binaries, sizes, factor, work)
            if nccl
            else SeedReference(args, collectives, sizes, work)
        )
        name = "nccl-tests" if nccl else "all_reduce_bench"
        print(
            f"busbw, {args.nproc} {'nccl' if nccl else 'gloo'} ranks, {', '.join(collectives)} at"
            f" {', '.join(human_size(s) for s in sizes)};"
            f" harness = {'all_reduce_bench again (--control)' if args.control else f'cluster.run({WORKLOAD})'},"
            f" reference = {name}; {args.warmup} warm-up + {args.iters} timed per size",
            flush=True,
        )
        print(sched_line, flush=True)
        comparison = run_interleaved(
            harness, reference, rule, on_round=_progress, warmup_rounds=WARMUP_ROUNDS, drop_converged=True
        )
    print()
    for line in report_lines(comparison, lambda k: f"{k} busbw", "GB/s", "harness", name):
        print(line)
    if not nccl and not args.control:
        _print_diagnostic(comparison, reference.diagnostics, WARMUP_ROUNDS)
    return 0


def _print_diagnostic(
    comparison: Any, diagnostics: Mapping[str, Mapping[str, list[float]]], warmup_rounds: int
) -> None:
    """Where a gap comes from. The seed averages per-trial rates of isolated collectives; the
    harness (as nccl-tests) divides a span of back-to-back collectives by their count. The same
    reference job also reads its trials other ways (the mean duration always, the span with
    ``--diagnose``); the harness's busbw over each, paired by round, shows how much of a gap is
    the definition rather than the harness. The warm-up calls come first in each list."""
    titles = {
        "busbw_mean_time_gbs": "vs the trials' mean duration",
        "busbw_span_gbs": "vs a back-to-back span (nccl-tests' timing)",
    }
    print("diagnostic (not gated): harness busbw over the reference's other readings of the same job,")
    print("  median paired quotient (95% CI):")
    for k in comparison.keys:
        cells = []
        for name, per_key in diagnostics.items():
            theirs = per_key[k][warmup_rounds:]
            ci = median_ci(paired_ratios(comparison.values(k, "harness"), theirs))
            interval = f"{ci.lo:.3f}-{ci.hi:.3f}" if ci.has_interval else "no CI yet"
            cells.append(f"{titles[name]} {ci.median:.3f} ({interval})")
        print(f"  {k}: {'; '.join(cells)}")


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"({time.monotonic() - started:.0f} s in all)")
    sys.exit(code)
