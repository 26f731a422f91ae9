"""Read the result tables that nccl-tests binaries (``all_reduce_perf`` and friends) print.

Text in, frozen dataclasses out, no I/O. The parser reads real logs as they come back from
clusters: Open MPI ``[1,0]<stdout>:`` tags, ``srun -l`` (``0: ``) and pdsh (``host: ``)
prefixes, indentation from Markdown, NCCL INFO/WARN and MPI help lines between table rows,
several runs in one file, and a last row cut off by a killed job. It knows both table
layouts nccl-tests has printed:

- before 2.10 or so: ``size count type [redop] [root] time algbw busbw error ...`` — the
  error column is a float (``2e-07``) or ``N/A``; rooted tests have ``root`` and no
  ``redop``; sendrecv has neither; alltoall leaves ``redop`` blank;
- since: ``size count type redop root time algbw busbw #wrong ...`` — ``#wrong`` is an
  integer, or ``N/A`` when validation is off (``-c 0``).

:func:`format_table` writes rows back in the second layout, so that our own sweep prints
what people already know how to read, and ``parse(format_table(rows))`` gives ``rows`` back.

Nothing here imports pytest, torch or any other module of the plugin but ``errors``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_gpucluster.errors import ParseError

__all__ = ["Measurement", "Row", "Run", "format_table", "parse", "runs_as_json", "strip_prefixes"]

PLACEMENTS = ("out_of_place", "in_place")

_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")  # mpirun --tag-output
_LABEL = re.compile(r"^\s*(?:\d+|[A-Za-z0-9][\w.\-]*):(?=\s|$)\s?")  # srun -l, pdsh
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\b")
_START = re.compile(r"^#\s*Collective test (starting|concluded):\s*(\S+)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_PREAMBLE = re.compile(r"^#\s*(nThread\s|nccl-tests version|Using devices)")
_BINARY = re.compile(
    r"(?<![\w-])(all_reduce|all_gather|reduce_scatter|alltoallv?|broadcast|reduce|sendrecv"
    r"|scatter|gather|hypercube)_perf(?:_mpi)?(?!\w)"
)
_IDENT = re.compile(r"^[A-Za-z_][\w]*$")
_INT = re.compile(r"^-?\d+$")


@dataclass(frozen=True, slots=True)
class Measurement:
    """One placement (out-of-place or in-place) of one row."""

    time_us: float
    """Average time of one operation, microseconds."""
    algbw_gbs: float
    """Algorithm bandwidth, GB/s (1e9 bytes/s)."""
    busbw_gbs: float
    """Bus bandwidth, GB/s, as nccl-tests computed it (see ``metrics.bus_factor``)."""
    wrong: int | None = None
    """The ``#wrong`` count of newer nccl-tests; None where absent or ``N/A`` (``-c 0``)."""
    error: float | None = None
    """The ``error`` column of older nccl-tests (max relative error); None where absent."""


@dataclass(frozen=True, slots=True)
class Row:
    """One message size of a run. See ``metrics.bus_factor`` for what ``size_bytes`` means."""

    size_bytes: int
    count: int
    """Elements per rank as nccl-tests prints it (per-rank count for all_gather, reduce_scatter)."""
    dtype: str | None
    redop: str | None
    """None where that nccl-tests version has no redop column, or leaves it blank."""
    root: int | None
    """-1 for unrooted collectives in newer versions; None where there is no root column."""
    out_of_place: Measurement | None
    in_place: Measurement | None


@dataclass(frozen=True, slots=True)
class Run:
    """One table: one invocation of one nccl-tests binary."""

    collective: str | None
    """``all_reduce``, ``all_gather``... (the binary without ``_perf``); None if the log never says."""
    nranks: int | None
    """Ranks listed under ``# Using devices``; None when the log has no such lines."""
    nnodes: int | None
    """Distinct hosts among those ranks; None when the log has no rank lines."""
    rows: tuple[Row, ...]
    avg_busbw_gbs: float | None
    """``# Avg bus bandwidth`` as printed (mean over all sizes and placements); None if cut off."""
    hosts: tuple[str, ...] = field(default=(), compare=False)
    """The distinct hosts, in order of first appearance (not part of the JSON form)."""

    def row(self, size_bytes: int) -> Row:
        """The first row of that size; KeyError names the sizes there are."""
        for candidate in self.rows:
            if candidate.size_bytes == size_bytes:
                return candidate
        raise KeyError(f"no row of {size_bytes} bytes; sizes: {[r.size_bytes for r in self.rows]}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form printed by ``gpucluster parse nccl-tests``."""
        return {
            "collective": self.collective,
            "nranks": self.nranks,
            "nnodes": self.nnodes,
            "rows": [asdict(r) for r in self.rows],
            "avg_busbw_gbs": self.avg_busbw_gbs,
        }


def runs_as_json(runs: Sequence[Run]) -> list[dict[str, Any]]:
    return [run.to_dict() for run in runs]


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Columns:
    prefix: tuple[str, ...]  # size, count, type, then any of redop, root
    groups: tuple[tuple[str, ...], ...]  # per placement: time, algbw, busbw, #wrong|error
    placements: tuple[str, ...]

    @property
    def width(self) -> int:
        return sum(len(g) for g in self.groups)


@dataclass
class _Builder:
    collective: str | None = None
    ranks: dict[int, str] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    avg: float | None = None
    columns: _Columns | None = None
    done: bool = False

    @property
    def started_table(self) -> bool:
        return bool(self.rows) or self.done

    def build(self) -> Run:
        hosts = tuple(dict.fromkeys(self.ranks.values()))
        return Run(
            collective=self.collective,
            nranks=len(self.ranks) or None,
            nnodes=len(hosts) or None,
            rows=tuple(self.rows),
            avg_busbw_gbs=self.avg,
            hosts=hosts,
        )


def parse(text: str, source: str = "the input") -> list[Run]:
    """Every run (table) in ``text``, in order; runs without a single result row are left out.

    ``source`` names the input in the error message. Raises :class:`ParseError` when the text
    holds no result row at all.
    """
    runs: list[Run] = []
    current: _Builder | None = None
    pending: str | None = None  # collective named by the latest command line / binary path
    last_columns: _Columns | None = None
    placement_line: str | None = None

    def fresh() -> _Builder:
        nonlocal current
        if current is not None and current.rows:
            runs.append(current.build())
        current = _Builder()
        return current

    for raw in text.splitlines():
        line = strip_prefixes(raw)
        if not line:
            continue
        if line.startswith("#"):
            if m := _START.match(line):
                name = _collective_name(m.group(2))
                if m.group(1) == "starting":
                    run = fresh() if current is None or current.started_table else current
                    run.collective = name
                elif current is not None:
                    current.done = True
                    pending = None
            elif m := _RANK.match(line):
                run = fresh() if current is None or current.started_table else current
                run.ranks[int(m.group(1))] = m.group(2)
            elif _PREAMBLE.match(line):
                if current is None or current.started_table:
                    fresh()
            elif m := _AVG.match(line):
                if current is not None:
                    current.avg = _float_or_none(m.group(1))
                    current.done = True
                    pending = None
            elif "out-of-place" in line or "in-place" in line:
                placement_line = line
            elif columns := _header(line, placement_line):
                run = fresh() if current is None or current.started_table else current
                run.columns = last_columns = columns
                if run.collective is None:
                    run.collective = pending
            continue
        if m := _BINARY.search(line):
            pending = _collective_name(m.group(0))
            continue
        columns = current.columns if current is not None and current.columns else last_columns
        if columns is None:
            continue
        row = _row(line.split(), columns)
        if row is None:
            continue
        if current is None or current.done:
            fresh().columns = columns
        assert current is not None
        current.rows.append(row)
    if current is not None and current.rows:
        runs.append(current.build())
    if not runs:
        raise ParseError(
            f"{source}: no nccl-tests result rows found. Expected a header line like "
            "'#  size  count  type  redop  root  time  algbw  busbw  #wrong ...' followed by rows "
            "of numbers; is this the stdout of rank 0 of an *_perf binary, and did it get past "
            "NCCL initialisation?"
        )
    return runs


def strip_prefixes(raw: str) -> str:
    """The line without launcher prefixes (``[1,0]<stdout>:``, ``0: ``, ``host: ``) and spaces."""
    line = raw.rstrip()
    for _ in range(2):  # pdsh around mpirun --tag-output, or the other way round
        line = _LABEL.sub("", _TAG.sub("", line), count=1)
    return line.strip()


def _collective_name(binary: str) -> str:
    name = binary.rsplit("/", 1)[-1]
    name = re.sub(r"_mpi$", "", name)
    return re.sub(r"_perf$", "", name)


def _header(line: str, placement_line: str | None) -> _Columns | None:
    tokens = line.lstrip("#").split()
    if len(tokens) < 7 or tokens[:2] != ["size", "count"] or "time" not in tokens:
        return None
    first = tokens.index("time")
    prefix = tuple(tokens[:first])
    starts = [i for i, t in enumerate(tokens) if t == "time"]
    groups = tuple(tuple(tokens[s:e]) for s, e in zip(starts, [*starts[1:], len(tokens)], strict=True))
    placements = PLACEMENTS[: len(groups)]
    if placement_line is not None and len(groups) == 2:
        out, inp = placement_line.find("out-of-place"), placement_line.find("in-place")
        if out != -1 and inp != -1 and inp < out:
            placements = ("in_place", "out_of_place")
    return _Columns(prefix, groups, placements)


def _row(tokens: list[str], columns: _Columns) -> Row | None:
    """A data row, or None for anything else (log noise, or a row cut off mid-line)."""
    width = columns.width
    n_prefix = len(tokens) - width
    if n_prefix < 3 or n_prefix > len(columns.prefix):
        return None
    if not (_INT.match(tokens[0]) and _INT.match(tokens[1]) and _IDENT.match(tokens[2])):
        return None
    optional = {"redop": None, "root": None}
    wanted = [c for c in columns.prefix[3:] if c in optional]
    for token in tokens[3:n_prefix]:
        key = "root" if _INT.match(token) else "redop" if _IDENT.match(token) else None
        if key is None or key not in wanted or optional[key] is not None:
            return None
        optional[key] = token
    measurements: dict[str, Measurement] = {}
    pos = n_prefix
    for placement, group in zip(columns.placements, columns.groups, strict=True):
        measurement = _measurement(group, tokens[pos : pos + len(group)])
        if measurement is None:
            return None
        measurements[placement] = measurement
        pos += len(group)
    return Row(
        size_bytes=int(tokens[0]),
        count=int(tokens[1]),
        dtype=tokens[2],
        redop=optional["redop"],
        root=int(optional["root"]) if optional["root"] is not None else None,
        out_of_place=measurements.get("out_of_place"),
        in_place=measurements.get("in_place"),
    )


def _measurement(names: tuple[str, ...], cells: list[str]) -> Measurement | None:
    values: dict[str, Any] = {}
    for name, cell in zip(names, cells, strict=True):
        key = name.lstrip("#")
        if key in ("time", "algbw", "busbw"):
            number = _float_or_none(cell)
            if number is None or number < 0:
                return None
            values[key] = number
        elif key == "wrong":
            if cell != "N/A" and not cell.isdigit():
                return None
            values["wrong"] = int(cell) if cell.isdigit() else None
        elif key == "error":
            number = _float_or_none(cell)
            if number is None and cell != "N/A":
                return None
            values["error"] = number
    if not {"time", "algbw", "busbw"} <= values.keys():
        return None
    return Measurement(
        time_us=values["time"],
        algbw_gbs=values["algbw"],
        busbw_gbs=values["busbw"],
        wrong=values.get("wrong"),
        error=values.get("error"),
    )


def _float_or_none(cell: str) -> float | None:
    try:
        value = float(cell)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

_PREFIX_FMT = "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}"
_GROUP_FMT = "  {:>7}  {:>6}  {:>6}  {:>6}"


def format_table(
    rows: Sequence[Row], collective: str | None = None, dtype: str | None = None, redop: str | None = None
) -> str:
    """Render ``rows`` in nccl-tests' (2.10+) column layout, ending with ``# Avg bus bandwidth``.

    ``collective`` (``"all_reduce"``) goes into a ``# Collective test starting:`` line so a
    reader knows the table; ``dtype`` and ``redop`` fill the type/redop cells of rows that
    leave them None (a row's own value wins). Every row must carry the same placements. The
    last column is ``#wrong``, or ``error`` when the rows carry old-style errors instead.
    Numbers keep nccl-tests' precision when that loses nothing, and more digits otherwise, so
    ``parse(format_table(rows))[0].rows == tuple(rows)``. The average is the mean busbw over
    every size and placement, as nccl-tests computes it.
    """
    if not rows:
        raise ValueError("format_table needs at least one row")
    placements = [p for p in PLACEMENTS if getattr(rows[0], p) is not None]
    if not placements or any(
        [p for p in PLACEMENTS if getattr(r, p) is not None] != placements for r in rows
    ):
        raise ValueError("every row must carry the same placements (out-of-place, in-place or both)")
    cells = [getattr(r, p) for r in rows for p in placements]
    has_wrong = any(m.wrong is not None for m in cells)
    has_error = any(m.error is not None for m in cells)
    if has_wrong and has_error:
        raise ValueError("rows mix the #wrong and the error column; nccl-tests prints one or the other")
    last = "error" if has_error else "#wrong"

    lines = [f"# Collective test starting: {collective}_perf"] if collective else []
    labels = {"out_of_place": "out-of-place", "in_place": "in-place"}
    group_width = len(_GROUP_FMT.format("", "", "", ""))
    lead = "#" + " " * (len(_PREFIX_FMT.format(*[""] * 5)) - 1)
    lines.append(lead + "".join(f"{labels[p]:^{group_width}}" for p in placements).rstrip())
    head = _PREFIX_FMT.format("size", "count", "type", "redop", "root")
    units = _PREFIX_FMT.format("(B)", "(elements)", "", "", "")
    for _ in placements:
        head += _GROUP_FMT.format("time", "algbw", "busbw", last)
        units += _GROUP_FMT.format("(us)", "(GB/s)", "(GB/s)", "")
    lines += ["#" + head[1:], "#" + units[1:].rstrip()]
    for r in rows:
        row_dtype = r.dtype if r.dtype is not None else dtype
        if row_dtype is None:
            raise ValueError(f"the row of {r.size_bytes} bytes has no dtype; pass dtype=")
        row_redop = r.redop if r.redop is not None else redop
        text = _PREFIX_FMT.format(
            r.size_bytes, r.count, row_dtype, row_redop or "", "" if r.root is None else r.root
        )
        for p in placements:
            m: Measurement = getattr(r, p)
            tail = _error_cell(m.error) if has_error else ("N/A" if m.wrong is None else str(m.wrong))
            time_decimals = 0 if m.time_us >= 10000 else 1 if m.time_us >= 1000 else 2
            text += _GROUP_FMT.format(
                _number(m.time_us, time_decimals), _number(m.algbw_gbs), _number(m.busbw_gbs), tail
            )
        lines.append(text)
    avg = sum(m.busbw_gbs for m in cells) / len(cells)
    lines += [f"# Avg bus bandwidth    : {avg:g}", "#"]
    return "\n".join(lines) + "\n"


def _number(value: float, decimals: int = 2) -> str:
    """nccl-tests' precision where it loses nothing, else as many digits as the value needs."""
    for places in range(decimals, 7):
        text = f"{value:.{places}f}"
        if float(text) == value:
            return text
    return repr(value)


def _error_cell(value: float | None) -> str:
    if value is None:
        return "N/A"
    text = f"{value:.0e}"
    return text if float(text) == value else repr(value)
