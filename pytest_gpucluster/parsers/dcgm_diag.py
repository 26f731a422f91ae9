"""``dcgmi diag -r <level> -j``: DCGM's diagnostics as per-GPU, per-test results.

Three JSON layouts are read (each seen in ``tests/data/dcgm/``):

- DCGM 2.x (NVVS 1.3 JSON): ``{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests":
  [{"name", "results": [{"gpu_ids": "0,1,2,3", "status": "PASS", "warnings": ["..."], "info": [...]}]}]}],
  "version"}}``; statuses upper-case, warnings plain strings;
- DCGM 3.x: the same keys, statuses ``Pass``/``Fail``/``Skip``, ``gpu_ids`` a string, an int, or
  ``gpu_id``; warnings objects ``{"warning", "error_id", ...}``; ``null`` entries inside ``tests``;
- DCGM 4.x: ``{"DCGM Diagnostic": {"test_categories": [... "results": [{"entity_group": "GPU",
  "entity_id": 0, "status", "warnings", "info"}], "test_summary": {"status", "info"}]}, "entity_groups",
  "metadata": {"version", "Driver Version Detected"}}``.

``dcgmi`` may print a banner before the JSON; it is skipped. A status word no table knows is kept as
printed, so nothing reads it as a pass. The plain-text table lives in :mod:`.dcgm_diag_text`, the
values both read into in :mod:`.dcgm_diag_model`.

Pure: text in, dataclasses out; no I/O, no pytest/torch imports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.dcgm_diag_model import (
    STATUSES,
    DiagReport,
    DiagResult,
    TestSummary,
    normalize_status,
)
from pytest_gpucluster.parsers.dcgm_diag_text import parse_dcgm_diag_text

__all__ = [
    "STATUSES",
    "DiagReport",
    "DiagResult",
    "TestSummary",
    "normalize_status",
    "parse_dcgm_diag",
    "parse_dcgm_diag_json",
    "to_json",
]

_EXPECTED = (
    "a JSON object with 'DCGM GPU Diagnostic' (DCGM 2.x/3.x) or 'DCGM Diagnostic' (DCGM 4.x) at its top"
)


def _strings(value: Any, where: str, source: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Warnings/info as texts (and error ids): a list of strings or of ``{"warning": ...}`` objects, a string, or null."""
    if value is None:
        return (), ()
    items = value if isinstance(value, list) else [value]
    texts: list[str] = []
    ids: list[int] = []
    for item in items:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, Mapping) and isinstance(item.get("warning", item.get("info")), str):
            texts.append(item.get("warning", item.get("info")))
            if isinstance(item.get("error_id"), int):
                ids.append(item["error_id"])
        elif item is not None:
            raise ParseError(
                f"{source}: '{where}': expected text or {{'warning': ...}} entries, got {item!r}"
            )
    return tuple(texts), tuple(ids)


def _ids(result: Mapping[str, Any], where: str, source: str) -> tuple[int, ...]:
    raw = result.get("entity_id", result.get("gpu_ids", result.get("gpu_id")))
    if raw is None:
        return ()
    if isinstance(raw, int) and not isinstance(raw, bool):
        return (raw,)
    if isinstance(raw, str) and re.fullmatch(r"\s*\d+(\s*,\s*\d+)*\s*", raw):
        return tuple(int(x) for x in raw.split(","))
    raise ParseError(f"{source}: '{where}': GPU id {raw!r} is not a number or a '0,1,2' list")


def _result(test: str, category: str | None, result: Any, where: str, source: str) -> DiagResult:
    if not isinstance(result, Mapping):
        raise ParseError(f"{source}: '{where}': expected an object with 'status', got {result!r}")
    status = result.get("status")
    if not isinstance(status, str):
        raise ParseError(f"{source}: '{where}': result has no 'status' text; keys {sorted(result)}")
    warnings, error_ids = _strings(result.get("warnings"), f"{where}.warnings", source)
    info, _ = _strings(result.get("info"), f"{where}.info", source)
    return DiagResult(
        test=test,
        status=normalize_status(status),
        category=category,
        entity=str(result.get("entity_group", "GPU")),
        ids=_ids(result, where, source),
        warnings=warnings,
        info=info,
        error_ids=error_ids,
    )


def _walk_categories(
    body: Mapping[str, Any], top: str, source: str
) -> tuple[list[DiagResult], list[TestSummary]]:
    categories = body.get("test_categories")
    if categories is None:
        return [], []
    if not isinstance(categories, list):
        raise ParseError(f"{source}: '{top}.test_categories' must be a list, got {type(categories).__name__}")
    results: list[DiagResult] = []
    summaries: list[TestSummary] = []
    for c, cat in enumerate(categories):
        if not isinstance(cat, Mapping) or not isinstance(cat.get("tests"), list):
            raise ParseError(
                f"{source}: '{top}.test_categories[{c}]' must be an object with a 'tests' list, got {cat!r:.80}"
            )
        category = cat.get("category") if isinstance(cat.get("category"), str) else None
        for t, test in enumerate(cat["tests"]):
            if test is None:  # DCGM 3.1 writes null between tests
                continue
            where = f"{top}.test_categories[{c}].tests[{t}]"
            if not isinstance(test, Mapping) or not isinstance(test.get("name"), str):
                raise ParseError(f"{source}: '{where}' must be an object with a 'name', got {test!r:.80}")
            for r, result in enumerate(test.get("results") or []):
                if result is not None:
                    results.append(_result(test["name"], category, result, f"{where}.results[{r}]", source))
            summary = test.get("test_summary")
            if isinstance(summary, Mapping) and isinstance(summary.get("status"), str):
                info, _ = _strings(summary.get("info"), f"{where}.test_summary.info", source)
                summaries.append(TestSummary(test["name"], normalize_status(summary["status"]), info))
    return results, summaries


def _serials(data: Mapping[str, Any]) -> dict[int, str]:
    """DCGM 4.x ``entity_groups``: GPU id -> serial number (``<<<NOT_SUPPORTED>>>`` left out)."""
    out: dict[int, str] = {}
    groups = data.get("entity_groups")
    for group in groups if isinstance(groups, list) else []:
        entities = group.get("entities") if isinstance(group, Mapping) else None
        for entity in entities if isinstance(entities, list) else []:
            if isinstance(entity, Mapping) and isinstance(entity.get("entity_id"), int):
                serial = entity.get("serial_num")
                if isinstance(serial, str) and "NOT_SUPPORTED" not in serial:
                    out[entity["entity_id"]] = serial
    return out


def _load(text: str, source: str) -> Mapping[str, Any]:
    start = text.find("{")
    if start < 0:
        raise ParseError(f"{source}: no JSON object found; expected {_EXPECTED}")
    try:
        data, _ = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        line = text.count("\n", 0, exc.pos) + 1
        column = exc.pos - (text.rfind("\n", 0, exc.pos) + 1) + 1
        raise ParseError(
            f"{source}: malformed JSON at line {line} column {column} ({exc.msg}); expected {_EXPECTED}. "
            "Was the output cut short or trimmed by hand?"
        ) from None
    if not isinstance(data, Mapping):
        raise ParseError(f"{source}: the JSON is a {type(data).__name__}; expected {_EXPECTED}")
    return data


def parse_dcgm_diag_json(text: str, source: str = "dcgmi diag output") -> DiagReport:
    """Parse ``dcgmi diag -j`` of DCGM 2.x, 3.x or 4.x; errors name ``source`` and the key path."""
    data = _load(text, source)
    top = next((k for k in ("DCGM Diagnostic", "DCGM GPU Diagnostic") if k in data), None)
    if top is None:
        raise ParseError(f"{source}: top-level keys are {sorted(data)}; expected {_EXPECTED}")
    body = data[top]
    if not isinstance(body, Mapping):
        raise ParseError(f"{source}: '{top}' must be an object, got {type(body).__name__}")
    results, summaries = _walk_categories(body, top, source)
    metadata = data.get("metadata") if isinstance(data.get("metadata"), Mapping) else {}
    version = metadata.get("version", body.get("version"))
    driver = metadata.get(
        "Driver Version Detected", body.get("Driver Version Detected", body.get("driver_version"))
    )
    runtime_error = body.get("runtime_error", data.get("runtime_error"))
    if not results and not summaries and not runtime_error:
        raise ParseError(f"{source}: '{top}' holds no test results and no runtime_error")
    return DiagReport(
        layout="dcgm-4.x" if top == "DCGM Diagnostic" else "dcgm-2.x/3.x",
        dcgm_version=str(version) if version is not None else None,
        driver_version=str(driver) if driver is not None else None,
        results=tuple(results),
        summaries=tuple(summaries),
        runtime_error=str(runtime_error) if runtime_error else None,
        serials=_serials(data),
    )


def parse_dcgm_diag(text: str, source: str = "dcgmi diag output") -> DiagReport:
    """JSON (``-j``) or the plain-text table, whichever ``text`` holds."""
    if "{" in text and re.search(r'"DCGM (GPU )?Diagnostic"', text):
        return parse_dcgm_diag_json(text, source)
    if "|" in text:
        return parse_dcgm_diag_text(text, source)
    return parse_dcgm_diag_json(text, source)


def to_json(report: DiagReport) -> dict[str, Any]:
    return report.to_json()
