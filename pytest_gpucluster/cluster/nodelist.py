"""Slurm nodelists (``SLURM_JOB_NODELIST``, ``scontrol show hostnames``): expand and compress.

Follows Slurm's hostlist syntax: terms are separated by commas or whitespace; a term is a
prefix with bracketed numeric ranges, ``node[001-008,010]``; zero padding is the width of the
range's first number; a term may hold several bracket groups (``rack[0-1]_blade[0-3]``, as in
``slurm.conf``), expanded as a cartesian product with the leftmost group varying slowest
(rack0_blade0, rack0_blade1, ..., rack1_blade0). Order is kept as written and duplicates are
kept, like ``scontrol show hostnames``. Pure functions; standard library only.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Mapping

from pytest_gpucluster.cluster.hostfile import hostname_problem
from pytest_gpucluster.errors import HostfileError

__all__ = ["MAX_HOSTS", "allocation_nodelist", "compress_nodelist", "expand_nodelist"]

MAX_HOSTS = 100_000
"""Refuse expansions beyond this: ``node[0-99999999]`` is a typo, not a cluster."""

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_TRAILING_NUMBER = re.compile(r"(.*?)([0-9]+)")


def _split_terms(expr: str) -> list[tuple[int, str]]:
    """Split at commas and whitespace outside brackets; return (offset, term) pairs."""
    terms: list[tuple[int, str]] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            if depth:
                raise HostfileError(f"Slurm nodelist {expr!r}: nested '[' at position {i}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostfileError(f"Slurm nodelist {expr!r}: ']' at position {i} has no matching '['")
            depth = 0
        elif not depth and (ch == "," or ch.isspace()):
            terms.append((start, expr[start:i]))
            start = i + 1
    if depth:
        opened = expr.rindex("[")
        raise HostfileError(f"Slurm nodelist {expr!r}: '[' at position {opened} has no matching ']'")
    terms.append((start, expr[start:]))
    return [(offset, term) for offset, term in terms if term]


def _expand_group(body: str, term: str, expr: str) -> list[str]:
    values: list[str] = []
    for item in body.split(","):
        match = _RANGE.fullmatch(item.strip())
        if not match:
            raise HostfileError(
                f"Slurm nodelist {expr!r}: {item!r} in {term!r} is not a number or a range like 1-8"
            )
        lo_text, hi_text = match.group(1), match.group(2)
        lo = int(lo_text)
        hi = int(hi_text) if hi_text is not None else lo
        if hi < lo:
            raise HostfileError(
                f"Slurm nodelist {expr!r}: range {item!r} in {term!r} runs backwards ({lo} > {hi})"
            )
        if hi - lo >= MAX_HOSTS:
            raise HostfileError(
                f"Slurm nodelist {expr!r}: range {item!r} holds {hi - lo + 1} hosts; the limit is {MAX_HOSTS}"
            )
        width = len(lo_text)
        values.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return values


def _expand_term(term: str, expr: str) -> list[str]:
    # Alternate literal text and bracket bodies: "gpu-[1-2]-[01-04]" -> ["gpu-", "1-2", "-", "01-04", ""].
    parts = re.split(r"\[([^\]]*)\]", term)
    choices: list[list[str]] = []
    total = 1
    for index, part in enumerate(parts):
        if index % 2:
            values = _expand_group(part, term, expr)
            total *= len(values)
            if total > MAX_HOSTS:
                raise HostfileError(
                    f"Slurm nodelist {expr!r}: {term!r} expands to more than {MAX_HOSTS} hosts"
                )
            choices.append(values)
        else:
            choices.append([part])
    return ["".join(combo) for combo in itertools.product(*choices)]


def allocation_nodelist(environ: Mapping[str, str] | None = None) -> str:
    """The nodelist of the Slurm allocation this process runs in (``SLURM_JOB_NODELIST``, or the
    older ``SLURM_NODELIST``), unexpanded; a `HostfileError` outside an allocation."""
    env = os.environ if environ is None else environ
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise HostfileError(
            "SLURM_JOB_NODELIST is not set: this process is not inside a Slurm allocation "
            "(run under salloc/sbatch, or give a hostfile)"
        )
    return nodelist


def expand_nodelist(expr: str) -> list[str]:
    """Expand a Slurm nodelist into host names, in Slurm's order.

    >>> expand_nodelist("node[001-003,010],login1")
    ['node001', 'node002', 'node003', 'node010', 'login1']
    """
    if not expr or not expr.strip():
        raise HostfileError("Slurm nodelist is empty; expected something like node[01-04]")
    hosts: list[str] = []
    for _, term in _split_terms(expr):
        for host in _expand_term(term, expr):
            problem = hostname_problem(host)
            if problem:
                raise HostfileError(f"Slurm nodelist {expr!r}: term {term!r} gives a bad name: {problem}")
            hosts.append(host)
        if len(hosts) > MAX_HOSTS:
            raise HostfileError(f"Slurm nodelist {expr!r} expands to more than {MAX_HOSTS} hosts")
    if not hosts:
        raise HostfileError(f"Slurm nodelist {expr!r} names no hosts")
    return hosts


def compress_nodelist(hosts: Iterable[str]) -> str:
    """The shortest-in-practice nodelist that expands back to exactly ``hosts``, in order.

    Adjacent hosts sharing a prefix go into one bracket group; consecutive numbers with the
    same zero padding become a range. ``expand_nodelist(compress_nodelist(h)) == list(h)``.
    """
    groups: list[tuple[str, list[list[str]]]] = []  # (prefix, runs of number strings)
    for host in hosts:
        problem = hostname_problem(host)
        if problem:
            raise HostfileError(f"cannot compress nodelist: {problem}")
        match = _TRAILING_NUMBER.fullmatch(host)
        if not match:
            groups.append((host, []))
            continue
        prefix, digits = match.groups()
        if groups and groups[-1][1] and groups[-1][0] == prefix:
            runs = groups[-1][1]
            run = runs[-1]
            following = int(run[-1]) + 1
            if int(digits) == following and f"{following:0{len(run[0])}d}" == digits:
                run.append(digits)
            else:
                runs.append([digits])
        else:
            groups.append((prefix, [[digits]]))

    terms = []
    for prefix, runs in groups:
        if not runs:
            terms.append(prefix)
        elif len(runs) == 1 and len(runs[0]) == 1:
            terms.append(prefix + runs[0][0])
        else:
            body = ",".join(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)
            terms.append(f"{prefix}[{body}]")
    return ",".join(terms)
