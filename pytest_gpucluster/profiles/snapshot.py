"""A profile as results.json keeps it, and back: what a later ``gpucluster report`` re-judges with.

The session's profile can differ from any file (``--hw=auto`` shapes it to the probed node), so the
effective model itself is written into results.json (``profile.model``). Quantities are written
with their canonical unit (``1.352e+11B/s``), as a profile file would say them, because the schema
refuses a bare number for a bandwidth; only the keys the profile wrote (pydantic's
``model_fields_set``) are kept, so defaults stay defaults and "written only" rules still hold.

Pure: the schema in, plain JSON out, and back.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from pytest_gpucluster.errors import GpuClusterError
from pytest_gpucluster.profiles import fields as f
from pytest_gpucluster.profiles.schema import ProfileModel

__all__ = ["SnapshotError", "profile_of_snapshot", "snapshot"]


class SnapshotError(GpuClusterError):
    """A results.json's ``profile.model`` that does not validate as a profile."""


_UNITS = {
    f.parse_bandwidth: "B/s",
    f.parse_bytes: "B",
    f.parse_duration: "s",
    f.parse_flops: "FLOP/s",
}


def _unit_of(annotation: Any, metadata: Any = ()) -> str | None:
    for meta in metadata:  # a plain ``Quantity`` field: pydantic moves its metadata onto the field
        unit = _UNITS.get(getattr(meta, "func", None))
        if unit:
            return unit
    for arg in (annotation, *typing.get_args(annotation)):
        for meta in getattr(arg, "__metadata__", ()):
            unit = _UNITS.get(getattr(meta, "func", None))
            if unit:
                return unit
        inner = typing.get_args(arg)
        if inner and arg is not annotation:
            found = _unit_of(arg)
            if found:
                return found
    return None


def _with_unit(value: Any, unit: str | None) -> Any:
    if unit is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return f"{float(value)!r}{unit}"
    if isinstance(value, dict):
        return {k: _with_unit(v, unit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_with_unit(v, unit) for v in value]
    return value


def _refuses_none(metadata: Any) -> bool:
    for meta in metadata:
        func = getattr(meta, "func", None)
        if func is not None:
            try:
                func(None)
            except (ValueError, TypeError):
                return True
    return False


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return snapshot(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def snapshot(model: BaseModel) -> dict[str, Any]:
    """``model`` (a profile or one of its sections) as JSON a profile file could hold: the keys it
    wrote, quantities with their unit."""
    out: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        if name not in model.model_fields_set:
            continue
        value = getattr(model, name)
        if value is None and _refuses_none([*getattr(info.annotation, "__metadata__", ()), *info.metadata]):
            out[name] = False  # a tolerance written `off` reads back as None, and None is refused
            continue
        out[name] = _with_unit(_plain(value), _unit_of(info.annotation, info.metadata))
    return out


def profile_of_snapshot(data: Mapping[str, Any], source: str) -> ProfileModel:
    """The profile a results.json recorded (`snapshot`), validated again."""
    try:
        return ProfileModel.model_validate(dict(data))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise SnapshotError(
            f"{source}: profile.model does not validate as a profile at {where}: {first['msg']}"
        ) from None
