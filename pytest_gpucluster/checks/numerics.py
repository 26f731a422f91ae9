"""Judging the numerics job (``workloads/numerics.py``): per host, rank, GPU and dtype.

Three verdicts on the digests and known answers every rank sent, and the throughput:

- **agreement** (``numerics.agreement``, seeds, at most 0): ranks on the same platform (GPU part
  and SM count, torch, CUDA, driver and cuBLAS versions; on a CPU its instruction set and threads — the rank's
  ``platform.key``) computed the same chain on the same inputs, and cuBLAS promises the same bits
  there. Per dtype and seed, the digest that more than half of those ranks produced is the answer;
  a rank that produced any other digest for a seed is in the minority for that seed. Where no
  digest has a majority (two ranks that disagree), every rank that disagrees with another is
  named: the vote cannot tell which is right, and both are suspects.
- **repeat stability** (``numerics.repeat_stability``, runs, at most 0): the runs of a seed on one
  rank whose digest differs from that rank's most frequent one. This catches an intermittent fault
  even where every GPU differs from every other (mixed versions, or a part nobody else has).
- **known answer** (``numerics.known_answer``, fraction of the error bound, at most 1): the small
  GEMM and its row sums against float64 (`workloads._numerics_chain.known_answer`).
- **throughput** (``numerics.matmul_flops``, FLOP/s per rank and dtype, the median over the timed
  chains with their spread), against the dtype's floor where the profile has one
  (`plans.numerics.dtype_floors`); a dtype with a floor that a rank did not run is not measured.

Where more than half the ranks of a platform are unstable for a dtype, the kernel is (cuBLAS
with atomics, a workspace setting not in effect): their agreement and stability checks are broken
measurements, not GPU suspects (:func:`unstable_kernels`). Any other failed verdict is also a
`Suspect` naming host, rank, GPU and dtype (:func:`suspects`). The self-test (:func:`injected_problem`) asks that the rank given a flipped bit, and only it, be named.

Pure: no torch, no pytest.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_gpucluster.burnin.drain import Suspect
from pytest_gpucluster.results.model import Check, Spread, ThresholdRef
from pytest_gpucluster.results.text import format_value

__all__ = [
    "AGREEMENT",
    "FLOPS",
    "KNOWN_ANSWER",
    "STABILITY",
    "Floor",
    "agreement_checks",
    "injected_problem",
    "known_answer_checks",
    "named",
    "self_test_check",
    "stability_checks",
    "suspects",
    "throughput_checks",
    "unstable_kernels",
]

AGREEMENT = "numerics.agreement"
STABILITY = "numerics.repeat_stability"
KNOWN_ANSWER = "numerics.known_answer"
FLOPS = "numerics.matmul_flops"
VERDICTS = (AGREEMENT, STABILITY, KNOWN_ANSWER)


@dataclass(frozen=True, slots=True)
class Floor:
    """A dtype's throughput floor, its profile key, and how it was derived (for the hint)."""

    value: float
    ref: ThresholdRef | None
    why: str


def _by_rank(values: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(values, key=lambda v: int(v["rank"]))


def _where(value: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    where: dict[str, Any] = {"host": str(value["host"]), "rank": int(value["rank"])}
    if value.get("gpu"):
        where["gpu"] = str(value["gpu"])
    where["dtype"] = dtype
    return where


def _who(value: Mapping[str, Any]) -> str:
    if value.get("gpu"):
        return f"{value['gpu']} of {value['host']} (rank {value['rank']})"
    return f"rank {value['rank']} on {value['host']}"


def _key(value: Mapping[str, Any]) -> str:
    return str((value.get("platform") or {}).get("key", "unknown platform"))


def _short(digest: str) -> str:
    return digest[:12]


# ------------------------------------------------------------------- a non-deterministic kernel


def _unstable(done: Mapping[str, Any]) -> bool:
    return any(len(counts) > 1 for counts in done["digests"].values())


def unstable_kernels(values: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(platform key, dtype) -> why, where more than half of 2+ ranks of the platform gave different
    bits run to run for the dtype: many GPUs failing alike at once is the kernel (a cuBLAS algorithm
    with atomics, a workspace setting not in effect), not the GPUs, and draining them all would be
    wrong. Their agreement and stability checks become broken measurements (rerun, look at the
    set-up), never hardware suspects."""
    ranks: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for value in values:
        for dtype in value.get("dtypes") or {}:
            ranks.setdefault((_key(value), dtype), []).append(value)
    found = {}
    for (key, dtype), members in ranks.items():
        shaky = [v for v in members if _unstable(v["dtypes"][dtype])]
        if len(members) >= 2 and len(shaky) * 2 > len(members):
            workspace = {str((v.get("platform") or {}).get("cublas_workspace")) for v in members}
            found[(key, dtype)] = (
                f"{len(shaky)} of {len(members)} ranks on {key} gave different {dtype} bits from run to run: "
                f"a non-deterministic kernel, not {len(shaky)} faulty GPUs (CUBLAS_WORKSPACE_CONFIG on the "
                f"ranks: {', '.join(sorted(workspace))}; torch.use_deterministic_algorithms was on). "
                "Rerun; if it stays, this dtype cannot be judged bit for bit on this torch/CUDA."
            )
    return found


def _kernel_problems(checks: list[Check], values: Iterable[Mapping[str, Any]]) -> list[Check]:
    """``checks`` with those of an unstable kernel's platform and dtype made broken measurements."""
    values = list(values)
    kernels = unstable_kernels(values)
    if not kernels:
        return checks
    platform = {int(v["rank"]): _key(v) for v in values}
    out = []
    for check in checks:
        why = kernels.get((platform.get(int(check.labels["rank"]), ""), str(check.labels["dtype"])))
        if why is not None and check.failed:
            check = replace(check, problem="broken measurement", hint=f"{why} {check.hint}")
        out.append(check)
    return out


# ------------------------------------------------------------------------------ (a) agreement


def _seed_verdict(produced: Mapping[int, set[str]]) -> tuple[str | None, set[int]]:
    """``produced``: rank -> the digests it produced for one dtype and seed. Returns the majority
    digest (None without one) and the ranks that disagree with it (without one: every rank that
    produced a digest some other rank did not)."""
    holders = Counter(d for digests in produced.values() for d in digests)
    ranks = len(produced)
    best, count = holders.most_common(1)[0] if holders else (None, 0)
    if best is not None and count * 2 > ranks:
        return best, {r for r, digests in produced.items() if digests != {best}}
    everyone = set.intersection(*produced.values()) if produced else set()
    return None, {r for r, digests in produced.items() if digests != everyone or len(digests) > 1}


def agreement_checks(values: Iterable[Mapping[str, Any]]) -> tuple[list[Check], list[str]]:
    """Per rank and dtype: the seeds on which it disagreed with its platform's majority (at most 0).
    Also the sentences for platforms with one rank only, whose agreement nobody can judge."""
    ranks = _by_rank(values)
    platforms: dict[str, list[Mapping[str, Any]]] = {}
    for value in ranks:
        platforms.setdefault(_key(value), []).append(value)
    checks: list[Check] = []
    alone: list[str] = []
    for key, members in platforms.items():
        if len(members) < 2:
            alone.append(f"{_who(members[0])} is the only rank on {key}: nothing to compare its bits with")
            continue
        dtypes = sorted({d for v in members for d in (v.get("dtypes") or {})})
        for dtype in dtypes:
            checks += _dtype_agreement(key, dtype, [v for v in members if dtype in (v.get("dtypes") or {})])
    return _kernel_problems(checks, ranks), alone


def _dtype_agreement(key: str, dtype: str, members: Sequence[Mapping[str, Any]]) -> list[Check]:
    seeds = sorted({s for v in members for s in v["dtypes"][dtype]["digests"]}, key=int)
    wrong: dict[int, list[str]] = {int(v["rank"]): [] for v in members}
    notes: dict[int, list[str]] = {int(v["rank"]): [] for v in members}
    for seed in seeds:
        produced = {int(v["rank"]): set(v["dtypes"][dtype]["digests"].get(seed, {})) for v in members}
        produced = {r: d for r, d in produced.items() if d}
        if len(produced) < 2:
            continue
        majority, disagree = _seed_verdict(produced)
        for rank in disagree:
            wrong[rank].append(seed)
            mine = ", ".join(_short(d) for d in sorted(produced[rank] - {majority}))
            if majority is None:
                notes[rank].append(
                    f"seed {seed}: {mine}, no digest held by a majority of {len(produced)} ranks"
                )
            else:
                agree = sum(1 for d in produced.values() if majority in d)
                notes[rank].append(
                    f"seed {seed}: {mine} where {agree} of {len(produced)} ranks gave {_short(majority)}"
                )
    checks = []
    for value in members:
        rank = int(value["rank"])
        hint = (
            f"{_who(value)}, {dtype}: the same chain on the same inputs gave other bits than its peers on "
            f"{key} ({'; '.join(notes[rank])}). cuBLAS promises identical bits on one part and "
            "version: suspect this device (silent data corruption); rerun, then reset or drain it."
            if wrong[rank]
            else f"{_who(value)}, {dtype}: agrees bit for bit with {len(members)} ranks on {key}"
        )
        checks.append(
            Check(AGREEMENT, float(len(wrong[rank])), "seeds", 0.0, "<=", labels=_where(value, dtype),
                  hint=hint, baseline_gate=False)
        )  # fmt: skip
    return checks


# ---------------------------------------------------------------------------- (c) stability


def stability_checks(values: Iterable[Mapping[str, Any]]) -> list[Check]:
    """Per rank and dtype: runs whose digest differs from the rank's most frequent one for that
    seed (at most 0)."""
    checks = []
    values = _by_rank(values)
    for value in values:
        for dtype, done in sorted((value.get("dtypes") or {}).items()):
            odd, notes = 0, []
            for seed, counts in sorted(done["digests"].items(), key=lambda item: int(item[0])):
                if len(counts) < 2:
                    continue
                total, top = sum(counts.values()), max(counts.values())
                odd += total - top
                at = done.get("first_change", {}).get(seed)
                notes.append(
                    f"seed {seed}: {len(counts)} different digests in {total} runs"
                    + (f", the first change at run {at}" if at is not None else "")
                )
            hint = (
                f"{_who(value)}, {dtype}: the same chain on the same inputs gave different bits from run "
                f"to run ({'; '.join(notes)}): an unstable GPU (or a non-deterministic kernel); rerun, "
                "then reset or drain it."
                if odd
                else f"{_who(value)}, {dtype}: {done['repeats']} repeats, identical bits"
            )
            checks.append(
                Check(STABILITY, float(odd), "runs", 0.0, "<=", labels=_where(value, dtype), hint=hint,
                      baseline_gate=False)
            )  # fmt: skip
    return _kernel_problems(checks, values)


# ------------------------------------------------------------------------- (b) known answer


def known_answer_checks(values: Iterable[Mapping[str, Any]]) -> list[Check]:
    """Per rank and dtype: the small problem's error as a fraction of its bound (at most 1)."""
    checks = []
    for value in _by_rank(values):
        for dtype, done in sorted((value.get("dtypes") or {}).items()):
            known = done["known_answer"]
            worst = known.get("worst") or {}
            u = known.get("u") or {}
            hint = (
                f"{_who(value)}, {dtype}: a {known['k']}x{known['k']} GEMM and its fp32 row sums against "
                f"float64: error at {known['ratio']:.3g} of the a-priori bound gamma_K |A||B| "
                f"(GEMM {known.get('gemm_ratio', math.nan):.3g}, row sums "
                f"{known.get('row_sum_ratio', math.nan):.3g}; unit roundoffs in {u.get('in')}, "
                f"accumulation {u.get('acc')}, out {u.get('out')}). Worst element "
                f"[{worst.get('row')},{worst.get('col')}]: {worst.get('got')} vs {worst.get('float64')} "
                f"(bound {worst.get('bound')}). Above 1 is a wrong answer: drain the GPU."
            )
            checks.append(
                Check(KNOWN_ANSWER, float(known["ratio"]), "of bound", 1.0, "<=", labels=_where(value, dtype),
                      hint=hint, baseline_gate=False)
            )  # fmt: skip
    return checks


# ---------------------------------------------------------------------------- throughput


def throughput_checks(
    values: Iterable[Mapping[str, Any]],
    floors: Mapping[str, Floor],
    ceilings: Mapping[str, tuple[float, str]] | None = None,
) -> list[Check]:
    """Per rank and dtype: median FLOP/s of the timed chains, against the dtype's floor if any. A
    dtype with a floor that the rank did not run is not measured (its skip reason in the hint); a
    median above the part's dense peak for the dtype (``ceilings``: dtype -> (FLOP/s, source)) is a
    broken measurement (a timer that missed the work, a chain that did not run), never a pass."""
    ceilings = ceilings or {}
    checks = []
    for value in _by_rank(values):
        done_all = value.get("dtypes") or {}
        for dtype in sorted(set(done_all) | set(floors)):
            floor = floors.get(dtype)
            done = done_all.get(dtype)
            where = _where(value, dtype)
            if done is None:
                why = (value.get("skipped") or {}).get(dtype, "the rank did not run it")
                assert floor is not None
                checks.append(
                    Check(FLOPS, math.nan, "FLOP/s", floor.value, ">=", floor.ref, labels=where,
                          hint=f"{_who(value)}, {dtype}: not run ({why}); floor {floor.why}",
                          problem="not measured")
                )  # fmt: skip
                continue
            spread = Spread(
                median=float(done["flops"]),
                min=float(done["flops_min"]),
                max=float(done["flops_max"]),
                mad=float(done["flops_mad"]),
                n=int(done["runs"]),
                values=tuple(float(r) for r in done.get("rates", ())),
            )
            what = (
                f"{_who(value)}, {dtype}: {done['depth']} chained {done['matmul_n']}x{done['matmul_n']} GEMMs, "
                f"median of {done['runs']} timed chains"
            )
            ceiling = ceilings.get(dtype)
            broken = ceiling is not None and float(done["flops"]) > ceiling[0]
            if broken and ceiling is not None:
                what += f"; above the dense {dtype} peak {format_value(ceiling[0], 'FLOP/s')} ({ceiling[1]})"
            checks.append(
                Check(
                    FLOPS,
                    float(done["flops"]),
                    "FLOP/s",
                    floor.value if floor else None,
                    ">=",
                    floor.ref if floor else None,
                    labels=where,
                    spread=spread,
                    hint=what + (f"; floor {floor.why}" if floor else ""),
                    problem="broken measurement" if broken else None,
                )
            )
    return checks


# ------------------------------------------------------------------------------- suspects


def named(checks: Iterable[Check]) -> list[tuple[str, int, str | None, str]]:
    """(host, rank, gpu, dtype) of every failed verdict that names a device (not a broken
    measurement), sorted and without repeats."""
    found = {
        (str(c.labels["host"]), int(c.labels["rank"]), c.labels.get("gpu"), str(c.labels["dtype"]))
        for c in checks
        if c.metric in VERDICTS and c.failed and c.problem is None
    }
    return sorted(found, key=lambda t: (t[1], t[3]))


def suspects(checks: Iterable[Check]) -> list[Suspect]:
    """A suspect per failed verdict (agreement, stability, known answer), naming host, rank, GPU
    and dtype, for the drain list."""
    out = []
    for check in checks:
        if check.metric not in VERDICTS or not check.failed or check.problem is not None:
            continue  # a broken measurement (an unstable kernel) names no GPU
        labels = check.labels
        out.append(
            Suspect(
                node=str(labels["host"]),
                rank=int(labels["rank"]),
                gpu=labels.get("gpu"),
                kind="gpu" if labels.get("gpu") else "node",
                check="numerics",
                reason=check.hint,
                evidence={
                    "metric": check.metric,
                    "dtype": labels["dtype"],
                    "value": check.value,
                    "threshold": check.threshold,
                    "unit": check.unit,
                },
            )
        )
    return out


def injected_problem(values: Sequence[Mapping[str, Any]], checks: Sequence[Check]) -> str | None:
    """The self-test: the rank that flipped a bit (its ``injected``) must be named for that dtype by
    the stability verdict and, where it has peers on its platform, the agreement verdict, and nobody
    else by any verdict. Why not, or None."""
    injected = [(v, v["injected"]) for v in values if v.get("injected")]
    if len(injected) != 1:
        return f"expected one rank to report an injected bit flip, got {len(injected)}"
    value, flip = injected[0]
    expected = (str(value["host"]), int(value["rank"]), value.get("gpu"), str(flip["dtype"]))
    got = named(checks)
    # agreement only where the rank had peers to agree with (one GPU: stability alone sees the flip)
    judged = [
        m
        for m in (AGREEMENT, STABILITY)
        if any(c.metric == m and c.labels["rank"] == expected[1] for c in checks)
    ]
    by_metric = {m: set(named(c for c in checks if c.metric == m)) for m in judged}
    missing = [m for m, who in by_metric.items() if expected not in who] or ([] if judged else [STABILITY])
    if got == [expected] and not missing:
        return None
    return (
        f"{_who(value)} flipped bit {flip['bit']} of its {flip['dtype']} output (seed {flip['seed']}, run "
        f"{flip['repeat']}); the verdicts named {got or 'nobody'}"
        + (f", and {', '.join(missing)} did not name it" if missing else "")
    )


def self_test_check(
    values: Sequence[Mapping[str, Any]],
    found: Sequence[tuple[str, int, str | None, str]],
    problem: str | None,
) -> Check:
    """The self-test's record (information): how many (host, rank, GPU, dtype) the verdicts named,
    labelled with the rank and dtype that flipped the bit; the hint lists them, and the problem."""
    flip = next(
        ({**v["injected"], **_where(v, v["injected"]["dtype"])} for v in values if v.get("injected")), {}
    )
    labels = {k: flip[k] for k in ("host", "rank", "gpu", "dtype") if flip.get(k) is not None}
    shown = "; ".join(f"rank {r} on {h}{f' ({g})' if g else ''}, {d}" for h, r, g, d in found)
    return Check(
        "numerics.self_test_named",
        float(len(found)),
        "ranks",
        labels={**labels, "injected": True},
        hint=f"named: {shown or 'nobody'}" + (f"; {problem}" if problem else ""),
    )


def flops_text(check: Check) -> str:
    """``bf16 0.31 TFLOP/s`` for progress lines."""
    return f"{check.labels.get('dtype')} {format_value(check.value, check.unit)}"
