"""The plain-text table ``dcgmi diag -r <level>`` prints (no ``-j``), as a :class:`~.dcgm_diag.DiagReport`.

Rows are ``| name | result |`` with a 46-character result column that DCGM wraps mid-word, so
wrapped messages are re-joined from the raw column, not from stripped text. Two generations:

- DCGM 3.x: ``| GPU Memory | Pass - GPUs: 1, 2, 3 |`` then ``|  | Fail - GPU: 0 |`` (or ``Fail - All``),
  followed by ``| Warning | GPU 0 Thermal violations ...`` rows;
- DCGM 4.x: ``| memory | Pass |`` (the whole test) then one ``|  | GPU0: Pass |`` row per GPU, with
  ``Warning`` rows in between that belong to the whole test.

Category rows (``|-----  Hardware  ---...``) set the category; ``Metadata`` rows give the versions.
Pure: no I/O, no pytest/torch imports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.dcgm_diag_model import DiagReport, DiagResult, normalize_status

__all__ = ["parse_dcgm_diag_text"]

_CATEGORY = re.compile(r"^\s*[|+]-{3,}\s+(?P<name>[A-Za-z][\w ]*?)\s+-+[+|]")
_ROW = re.compile(r"^\s*\|(?P<name>[^|]*)\|(?P<value>.*)$")
# "Pass - GPUs: 1, 2, 3" / "Fail - GPU: 0" / "Fail - All" / "Pass"
_VERDICT = re.compile(
    r"^(?P<status>Pass|Fail|Warn|Skip|Not Run)(?:\s*-\s*(?:GPUs?:\s*(?P<ids>[\d,\s]+)|(?P<all>All)))?$"
)
_PER_GPU = re.compile(r"^GPU\s?(?P<id>\d+):\s*(?P<status>[A-Za-z ]+)$")  # 4.x "GPU0: Pass"
_MESSAGE_KINDS = {"warning": "warnings", "info": "info", "error": "warnings"}
_VALUE_WIDTH = 45  # DCGM wraps results at 45 characters: "| " + 45 + "  |"


@dataclass
class _Test:
    name: str
    category: str | None
    results: list[DiagResult] = field(default_factory=list)
    whole: DiagResult | None = None  # 4.x: the test-level verdict, warnings attach to it

    def attach(self, kind: str, text: str) -> None:
        """Add a Warning/Info message to the verdict it follows: the last per-GPU one, else the whole test's."""
        if self.results:
            last = self.results[-1]
            self.results[-1] = replace(last, **{kind: (*getattr(last, kind), text)})
        elif self.whole is not None:
            self.whole = replace(self.whole, **{kind: (*getattr(self.whole, kind), text)})


def _raw_value(line: str, row: re.Match[str]) -> str:
    """The result column as printed, trailing pad included, so a wrap mid-word re-joins exactly."""
    value = row.group("value")
    value = value[1:] if value.startswith(" ") else value
    return value[:_VALUE_WIDTH] if len(value) > _VALUE_WIDTH else value.rstrip("|")


def _verdict(text: str, test: _Test) -> DiagResult | None:
    if m := _VERDICT.match(text):
        ids = tuple(int(x) for x in m.group("ids").split(",") if x.strip()) if m.group("ids") else ()
        return DiagResult(test.name, normalize_status(m.group("status")), test.category, ids=ids)
    if m := _PER_GPU.match(text):
        return DiagResult(
            test.name, normalize_status(m.group("status")), test.category, ids=(int(m.group("id")),)
        )
    return None


class _Reader:
    def __init__(self) -> None:
        self.category: str | None = None
        self.tests: list[_Test] = []
        self.meta: dict[str, str] = {}
        self.message: tuple[str, str] | None = None  # (kind, text so far)

    def flush_message(self) -> None:
        if self.message is None or not self.tests:
            self.message = None
            return
        kind, text = self.message
        self.message = None
        self.tests[-1].attach(kind, " ".join(text.split()))

    def row(self, name: str, raw: str) -> None:
        value = raw.strip()
        if self.category == "Metadata":
            self.meta[name] = value
            return
        if name.lower() in _MESSAGE_KINDS:
            self.flush_message()
            self.message = (_MESSAGE_KINDS[name.lower()], raw)
            return
        if name:
            self.flush_message()
            test = _Test(name, self.category)
            self.tests.append(test)
            verdict = _verdict(value, test)
            if verdict is not None and not verdict.ids and _VERDICT.match(value) and "All" not in value:
                test.whole = verdict  # 4.x: "| memory | Pass |" before its per-GPU lines
            elif verdict is not None:
                test.results.append(verdict)
            return
        if not self.tests:
            return
        verdict = _verdict(value, self.tests[-1])
        if verdict is not None:
            self.flush_message()
            self.tests[-1].results.append(verdict)
        elif self.message is not None:
            self.message = (self.message[0], self.message[1] + raw)


def parse_dcgm_diag_text(text: str, source: str = "dcgmi diag output") -> DiagReport:
    """Parse the plain ``dcgmi diag`` table; raises :class:`ParseError` naming ``source`` when it holds no test row."""
    reader = _Reader()
    for line in text.splitlines():
        if m := _CATEGORY.match(line):
            reader.flush_message()
            reader.category = m.group("name").strip()
            continue
        row = _ROW.match(line)
        if not row or set(line.strip()) <= set("+=-|"):
            continue
        name = row.group("name").strip()
        if name == "Diagnostic" and row.group("value").strip().startswith("Result"):
            continue
        if "|" not in row.group("value") and not name and reader.message is None:
            continue  # a row cut off by the paste
        reader.row(name, _raw_value(line, row))
    reader.flush_message()
    results: list[DiagResult] = []
    for test in reader.tests:
        if test.whole is not None:
            results.append(test.whole)
        results.extend(test.results)
    if not results:
        raise ParseError(
            f"{source}: no '| <test> | Pass/Fail/Skip ... |' row; expected the table 'dcgmi diag -r <level>' prints"
        )
    return DiagReport(
        layout="text",
        dcgm_version=reader.meta.get("DCGM Version"),
        driver_version=reader.meta.get("Driver Version Detected"),
        results=tuple(results),
    )
