"""The values ``dcgmi diag`` is read into, whichever form it printed (JSON: `parsers.dcgm_diag`;
the plain-text table: `parsers.dcgm_diag_text`): `DiagReport` of per-GPU `DiagResult` s, and the
status words normalised. Both readers import it; it imports neither.

Pure: no I/O, no pytest/torch imports.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["STATUSES", "DiagReport", "DiagResult", "TestSummary", "normalize_status"]

STATUSES: dict[str, str] = {
    "pass": "Pass",
    "fail": "Fail",
    "warn": "Warn",
    "warning": "Warn",
    "skip": "Skip",
    "skipped": "Skip",
    "not run": "Not Run",
    "notrun": "Not Run",
    "not_run": "Not Run",
}
_GPU_IN_TEXT = re.compile(r"\bGPU\s?(\d+)\b")


def normalize_status(word: str) -> str:
    """``PASS``/``Pass``/``pass`` -> ``Pass`` ... ``SKIPPED`` -> ``Skip``; an unknown word is returned stripped."""
    return STATUSES.get(" ".join(word.lower().split()), word.strip())


@dataclass(frozen=True, slots=True)
class DiagResult:
    """One test's verdict on the GPUs (entities) it names.

    ``ids`` is empty when DCGM named none (a whole-test verdict, e.g. the text table's ``Fail - All``
    or a 4.x test whose failure no GPU line explains).
    """

    test: str
    status: str
    category: str | None = None
    entity: str = "GPU"
    ids: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()
    info: tuple[str, ...] = ()
    error_ids: tuple[int, ...] = ()

    def blamed(self) -> tuple[int, ...]:
        """The GPUs a Fail/Warn is about: those its warnings name (``GPU 0``, ``GPU3``) among ``ids``, else ``ids``.

        DCGM 2.x reports one result for several GPUs (``gpu_ids: "0,1,2,3"``) and names the failing
        ones only in its warnings ("... desired stress level of 3000.0 for GPU 2").
        """
        named = tuple(sorted({int(n) for w in self.warnings for n in _GPU_IN_TEXT.findall(w)}))
        if named and (not self.ids or set(named) <= set(self.ids)):
            return named
        return self.ids

    def to_json(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "test": self.test,
            "entity": self.entity,
            "ids": list(self.ids),
            "status": self.status,
            "blamed": list(self.blamed()) if self.status in ("Fail", "Warn") else [],
            "warnings": list(self.warnings),
            "info": list(self.info),
            "error_ids": list(self.error_ids),
        }


@dataclass(frozen=True, slots=True)
class TestSummary:
    """DCGM 4.x's per-test verdict over all GPUs (``test_summary``), with its own info lines."""

    test: str
    status: str
    info: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DiagReport:
    """A whole ``dcgmi diag`` run."""

    layout: str  # "dcgm-2.x/3.x", "dcgm-4.x" or "text"
    dcgm_version: str | None
    driver_version: str | None
    results: tuple[DiagResult, ...]
    summaries: tuple[TestSummary, ...] = ()
    runtime_error: str | None = None
    serials: Mapping[int, str] = field(default_factory=dict)

    def with_status(self, status: str) -> tuple[DiagResult, ...]:
        return tuple(r for r in self.results if r.status == status)

    def failures(self) -> tuple[DiagResult, ...]:
        return self.with_status("Fail")

    def tests(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.test for r in self.results))

    def to_json(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "dcgm_version": self.dcgm_version,
            "driver_version": self.driver_version,
            "runtime_error": self.runtime_error,
            "results": [r.to_json() for r in self.results],
            "summaries": [{"test": s.test, "status": s.status, "info": list(s.info)} for s in self.summaries],
            "failures": [
                f"{r.test}: GPU {', '.join(map(str, r.blamed())) or '(none named)'}" for r in self.failures()
            ],
            "serials": {str(k): v for k, v in self.serials.items()},
        }
