"""The results files a profile is derived from: their measurements, profile and fingerprint, and
the ``--margin`` a derived threshold keeps from what was measured."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.profiles.quantities import parse_fraction
from pytest_gpucluster.results.model import Measurement

__all__ = ["SourceRun", "parse_margin", "read_run"]


@dataclass(frozen=True, slots=True)
class SourceRun:
    """One results.json: its measurements and where they come from."""

    path: Path
    measurements: tuple[Measurement, ...]
    profile: Mapping[str, Any]
    fingerprint: Mapping[str, Any]
    started_at: float | None

    @property
    def date(self) -> str:
        if self.started_at is None:
            return "unknown date"
        stamp = dt.datetime.fromtimestamp(float(self.started_at), tz=dt.timezone.utc)
        return stamp.strftime("%Y-%m-%d %H:%M UTC")

    @property
    def fingerprint_id(self) -> str:
        text = json.dumps(self.fingerprint, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def fingerprint_line(self) -> str:
        fp = self.fingerprint
        versions = fp.get("versions") or {}
        gpus = f"{fp.get('gpu_count', 0)} x {fp.get('gpu_model')}" if fp.get("gpu_count") else "no GPU"
        hosts = fp.get("hosts") or [fp.get("hostname")]
        soft = ", ".join(
            f"{name} {versions[name]}"
            for name in ("torch", "nccl", "cuda", "driver", "deepspeed")
            if versions.get(name)
        )
        return f"hosts {', '.join(str(h) for h in hosts if h)}; {gpus}; {soft}; fingerprint {self.fingerprint_id}"


def read_run(path: Path) -> SourceRun:
    """Read a results.json; ProfileError names the file when it is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"cannot read results file {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("measurements"), list):
        raise ProfileError(f"{path} is not a pytest-gpucluster results.json (no 'measurements' list)")
    try:
        measurements = tuple(Measurement.from_json(m) for m in data["measurements"])
    except (TypeError, ValueError, KeyError) as exc:
        raise ProfileError(f"{path}: a measurement is malformed: {exc}") from None
    return SourceRun(
        path=Path(path),
        measurements=measurements,
        profile=data.get("profile") or {},
        fingerprint=data.get("fingerprint") or {},
        started_at=data.get("started_at"),
    )


def parse_margin(text: str) -> float:
    """``"10%"`` -> 0.1; a bare number above 1 is read as percent (``10`` -> 0.1)."""
    try:
        value = parse_fraction(text if "%" in text or float(text) <= 1 else f"{text}%")
    except ValueError:
        raise ProfileError(f"--margin {text!r}: expected a percentage such as 10%") from None
    if not 0 <= value < 1:
        raise ProfileError(f"--margin {text!r}: expected a percentage from 0% to below 100%")
    return value
