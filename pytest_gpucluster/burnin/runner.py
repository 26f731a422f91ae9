"""Running the pair tests of a localization round: real jobs through a `Cluster`.

`ClusterPairRunner` launches one ``workloads.health:pair_allreduce`` job per node pair; the
node-disjoint pairs of a round run at the same time (`pairwise.waves`), one thread per job,
as a real cluster would run them. (Under pytest-xdist, `Cluster.run` takes the node's device
lock, so the jobs of one round then run one after another: slower, same verdict.)

`LocalGroupRunner` is the stand-in where nodes cannot be made (no network namespaces): each
"node" is one local rank, and a round is a single job in which each pair of ranks runs its
all_reduce in its own process subgroup, all pairs at once. It exercises the algorithm, not a
network.

Both count the pair tests they ran (``pair_tests``) and the jobs they launched (``jobs``).
No torch, no pytest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pytest_gpucluster.burnin.pairwise import Pair, PairResult, waves
from pytest_gpucluster.errors import GpuClusterError

__all__ = ["PAIR_GROUPS_WORKLOAD", "PAIR_WORKLOAD", "ClusterPairRunner", "LocalGroupRunner"]

PAIR_WORKLOAD = "pytest_gpucluster.workloads.health:pair_allreduce"
PAIR_GROUPS_WORKLOAD = "pytest_gpucluster.workloads.health:pair_groups"


def _first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), text)[:300]


class ClusterPairRunner:
    """``run_round`` for `pairwise.localize`, launching real pair jobs."""

    def __init__(
        self,
        cluster: Any,
        *,
        nproc_per_node: int | None = None,
        size_bytes: int = 4 << 20,
        iters: int = 10,
        timeout_s: float = 300.0,
        env: Mapping[str, str] | None = None,
        options: Mapping[str, Any] | None = None,
        concurrent: bool = True,
        on_result: Callable[[int, PairResult], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.nproc_per_node = nproc_per_node
        self.options = {"size_bytes": int(size_bytes), "iters": int(iters), **dict(options or {})}
        self.timeout_s = timeout_s
        self.env = dict(env or {})
        self.concurrent = concurrent
        self.on_result = on_result
        self.jobs = 0
        self.pair_tests = 0
        self.job_ids: list[str] = []

    def _one(self, round_number: int, pair: Pair) -> PairResult:
        a, b = pair
        try:
            job = self.cluster.run(
                PAIR_WORKLOAD,
                nodes=[a, b],
                nproc_per_node=self.nproc_per_node,
                env=self.env,
                timeout=self.timeout_s,
                options=self.options,
                name=f"pair-r{round_number}-{a}-{b}",
                check=False,  # a failed pair is a finding about that pair, not the end of the test
            )
        except GpuClusterError as exc:
            return PairResult(pair, None, error=f"could not launch: {exc}")
        self.job_ids.append(job.job_id)
        if not job.ok:
            return PairResult(pair, None, _first_line(job.failure_report()), job.job_id, job.duration_s)
        value = job.ranks[0].value or {}
        return PairResult(pair, float(value["busbw"]), None, job.job_id, job.duration_s)

    def __call__(self, round_number: int, pairs: Sequence[Pair]) -> list[PairResult]:
        results: list[PairResult] = []
        for wave in waves(pairs):
            self.jobs += len(wave)
            self.pair_tests += len(wave)
            if self.concurrent and len(wave) > 1:
                with ThreadPoolExecutor(max_workers=len(wave)) as pool:
                    done = list(pool.map(lambda p: self._one(round_number, p), wave))
            else:
                done = [self._one(round_number, p) for p in wave]
            for result in done:
                if self.on_result is not None:
                    self.on_result(round_number, result)
            results += done
        return results


class LocalGroupRunner:
    """``run_round`` where each "node" is one local rank: one job per round, pairs as subgroups."""

    def __init__(
        self,
        cluster: Any,
        nodes: Sequence[str],
        *,
        size_bytes: int = 1 << 20,
        iters: int = 10,
        timeout_s: float = 300.0,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.cluster = cluster
        self.rank_of = {node: i for i, node in enumerate(nodes)}
        self.options = {"size_bytes": int(size_bytes), "iters": int(iters), **dict(options or {})}
        self.timeout_s = timeout_s
        self.jobs = 0
        self.pair_tests = 0

    def __call__(self, round_number: int, pairs: Sequence[Pair]) -> list[PairResult]:
        results: list[PairResult] = []
        for wave in waves(pairs):
            self.jobs += 1
            self.pair_tests += len(wave)
            ranked = [[self.rank_of[a], self.rank_of[b]] for a, b in wave]
            job = self.cluster.run(
                PAIR_GROUPS_WORKLOAD,
                nodes=1,
                nproc_per_node=len(self.rank_of),
                timeout=self.timeout_s,
                options={**self.options, "pairs": ranked},
                name=f"pair-groups-r{round_number}",
                check=False,
            )
            if not job.ok:
                error = _first_line(job.failure_report())
                results += [PairResult(p, None, error, job.job_id) for p in wave]
                continue
            by_rank = {r.rank: r.value or {} for r in job.ranks}
            for (a, _b), (ra, _rb) in zip(wave, ranked, strict=True):
                busbw = by_rank[ra].get("busbw")
                results.append(
                    PairResult(
                        (a, _b), None if busbw is None else float(busbw), None, job.job_id, job.duration_s
                    )
                )
        return results
