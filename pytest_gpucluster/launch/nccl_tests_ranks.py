"""Did one nccl-tests invocation run as one job of nodes x GPUs per node ranks? Read from its output.

nccl-tests prints its header (``# nThread ...``, ``# Using devices``, one ``# Rank N ... on HOST
device D`` line per rank) from the first rank of the job only. A binary built without ``MPI=1`` and
started by mpirun or srun runs one independent job per process: every process prints its own
header, its own ``Rank 0``, and a table of its own; with ``-g 1`` each table is a single rank, where
nccl-tests' bus factor is 0, so every ``busbw`` reads 0.00. The same happens to an MPI build started
by another MPI's launcher (each process a singleton). Read as one job, that output looks like a
bandwidth failure; it is a build mistake. So, in one invocation's output:

- more than one ``Rank 0`` line (or more than one ``# nThread`` header): several processes each ran
  alone — `NonMpiBuild`, whose message says so and how to rebuild, never a bandwidth figure;
- otherwise the ranks the table lists must be the nodes x GPUs per node that were asked for;
  a different count (a host left out, ``CUDA_VISIBLE_DEVICES`` hiding GPUs) is a `RankMismatch`.

The check reads the raw text as well as the parsed runs: processes of a non-MPI build write at the
same time, so their tables interleave and the parser may see one garbled run, or none.
Pure: no I/O; imports only the parser and the errors.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pytest_gpucluster.errors import LaunchError
from pytest_gpucluster.parsers.nccl_tests import Run, strip_prefixes

__all__ = ["NonMpiBuild", "RankMismatch", "check_ranks", "separate_processes"]

_RANK_ZERO = re.compile(r"^#\s*Rank\s+0\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\b")
_HEADER = re.compile(r"^#\s*nThread\s+\d+\s+nGpus\s+(\d+)\b")


class NonMpiBuild(LaunchError):
    """Several nccl-tests processes each ran as a job of their own (a build without MPI=1)."""


class RankMismatch(LaunchError):
    """nccl-tests ran, as one job, with a rank count other than nodes x GPUs per node."""


def separate_processes(text: str) -> int:
    """How many processes printed a header of their own: distinct ``Rank 0`` lines (pid, host),
    or ``# nThread`` headers where the rank lines were cut off; 1 for a normal run, 0 for none."""
    zeros: set[tuple[str, str]] = set()
    headers = 0
    for raw in text.splitlines():
        line = strip_prefixes(raw)
        if m := _RANK_ZERO.match(line):
            zeros.add((m.group(1), m.group(2)))
        elif _HEADER.match(line):
            headers += 1
    return max(len(zeros), headers)


def check_ranks(text: str, runs: Sequence[Run], *, nodes: int, gpus_per_node: int, source: str) -> None:
    """Raise `NonMpiBuild` or `RankMismatch` unless ``text`` (one invocation's output, parsed into
    ``runs``) is one job of ``nodes x gpus_per_node`` ranks. ``source`` names the log."""
    expected = nodes * gpus_per_node
    wanted = f"{expected} rank(s) ({nodes} node(s) x {gpus_per_node} GPU(s) per node)"
    processes = separate_processes(text)
    if processes > 1:
        raise NonMpiBuild(
            f"nccl-tests was built without MPI (MPI=1): each of {processes} processes ran alone "
            f"{_alone(runs)}instead of as one job of {wanted}. Its bandwidth figures are not the "
            "cluster's. Rebuild with `make clean; make MPI=1 MPI_HOME=... CUDA_HOME=... NCCL_HOME=...` "
            "against the MPI that starts it (a binary linked to another MPI than the launcher's "
            f"mpirun, or srun's --mpi plugin, also runs each process alone). Output: {source}"
        )
    counts = sorted({run.nranks for run in runs}, key=lambda n: -1 if n is None else n)
    if counts == [expected]:
        return
    if None in counts:
        raise RankMismatch(
            f"nccl-tests printed no '# Rank N ... on HOST device D' lines, so it cannot be told that "
            f"it ran {wanted}; every nccl-tests version prints them before its table. Output: {source}"
        )
    hosts = sorted({host for run in runs for host in run.hosts})
    raise RankMismatch(
        f"nccl-tests ran with {' and '.join(map(str, counts))} rank(s) on {', '.join(hosts) or 'no host named'}; "
        f"expected {wanted}. Look for a node missing from the launch or GPUs hidden by "
        f"CUDA_VISIBLE_DEVICES. Output: {source}"
    )


def _alone(runs: Sequence[Run]) -> str:
    """``(tables of 1 rank, busbw 0) `` when the parsed runs show it, else nothing."""
    if not runs:
        return ""
    ranks = sorted({run.nranks for run in runs if run.nranks is not None})
    busbw = [m.busbw_gbs for run in runs for row in run.rows for m in (row.out_of_place, row.in_place) if m]
    said = [f"tables of {'/'.join(map(str, ranks))} rank(s)"] if ranks else []
    if busbw and max(busbw) == 0:
        said.append("busbw 0")
    return f"({', '.join(said)}) " if said else ""
