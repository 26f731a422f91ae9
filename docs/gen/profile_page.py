"""The profile keys reference: every key of the profile schema (``profiles.schema`` and the
``schema_*`` modules it is built from), with its type and unit, its default, what it means and, for
a threshold, the tests that judge it (``checks.fail_closed.OWNERS``: a threshold whose tests ran and
recorded nothing fails as NOT MEASURED).
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import pydantic
from pydantic_core import PydanticUndefined

from docs.gen.md import GENERATED, cell, code, table

__all__ = ["render_profile_keys"]

_UNITS = {
    "parse_bandwidth": ("bandwidth", "B/s", "`115GB/s`, `920Gbps`"),
    "parse_bytes": ("size", "B", "`64MiB`, `16GB`"),
    "parse_duration": ("duration", "s", "`7.8s`, `50us`, `10min`"),
    "_timeout": ("duration", "s", "`20min`, or a number of seconds"),
    "parse_fraction": ("fraction", "fraction", "`92%`, `0.92`"),
    "parse_flops": ("compute rate", "FLOP/s", "`989TFLOP/s`"),
    "_tolerance": ("tolerance", "fraction", "`5%`, or `off`"),
    "env_mapping": ("environment", "", "`{NCCL_IB_HCA: mlx5}`"),
}
"""A quantity's parser (the ``BeforeValidator`` of its annotated type) -> its kind, canonical unit
and how a profile writes it."""


@dataclass(frozen=True, slots=True)
class Key:
    key: str
    kind: str
    unit: str
    default: str
    description: str


def _validator(annotation: Any) -> str | None:
    for meta in getattr(annotation, "__metadata__", ()):
        func = getattr(meta, "func", None)
        if func is not None:
            return func.__name__
    return None


def _kind(annotation: Any) -> tuple[str, str]:
    """(type as a reader says it, unit) of an annotation."""
    origin = typing.get_origin(annotation)
    name = _validator(annotation)
    if name in _UNITS:
        kind, unit, _ = _UNITS[name]
        return kind, unit
    if origin is typing.Annotated:
        return _kind(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in typing.get_args(annotation)), ""
    args = typing.get_args(annotation)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        rest = [a for a in args if a is not type(None)]
        kinds = [_kind(a) for a in rest]
        text = " or ".join(k for k, _ in kinds)
        return (text + " or null" if len(rest) < len(args) else text), next((u for _, u in kinds if u), "")
    if origin in (tuple, list):
        kind, unit = _kind(args[0]) if args else ("value", "")
        return (f"list, each {kind}" if kind.startswith("one of") else f"list of {kind}"), unit
    if origin is dict:
        key, _ = _kind(args[0])
        value, unit = _kind(args[1])
        return f"mapping of {key} to {value}", unit
    simple = {int: "integer", float: "number", str: "text", bool: "true/false"}
    return simple.get(annotation, getattr(annotation, "__name__", str(annotation))), ""


def _submodels(annotation: Any) -> tuple[list[type[pydantic.BaseModel]], bool]:
    """The sections a field holds and whether it is a list of them (``checks: [...]``)."""
    args = typing.get_args(annotation) or (annotation,)
    subs = [
        b
        for a in args
        for b in (typing.get_args(a) or (a,))
        if isinstance(b, type) and issubclass(b, pydantic.BaseModel)
    ]
    listed = typing.get_origin(annotation) in (list, tuple) or any(
        typing.get_origin(a) in (list, tuple) for a in args
    )
    return subs, listed


@cache
def _attribute_docstrings(cls: type) -> dict[str, str]:
    """``name: T = ...`` followed by a string literal: that string, by field name."""
    out: dict[str, str] = {}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return out
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            out[node.target.id] = nxt.value.value
    return out


def _default(f: Any) -> str:
    if f.default_factory is not None:
        value = f.default_factory()
    elif f.default is PydanticUndefined:
        return "required"
    else:
        value = f.default
    if value is None:
        return "null"
    if value in ((), {}, []):
        return "empty"
    if isinstance(value, bool):
        return code(str(value).lower())
    if isinstance(value, tuple):
        return code(", ".join(map(str, value)))
    return code(f"{value:g}" if isinstance(value, float) else str(value))


def _description(cls: type, name: str, f: Any) -> str:
    return f.description or _attribute_docstrings(cls).get(name, "")


def walk(cls: type[pydantic.BaseModel], prefix: str = "") -> Iterator[Key]:
    """Every leaf key under ``cls``, list entries written ``[]``, in schema order."""
    for name, f in cls.model_fields.items():
        here = f"{prefix}.{name}" if prefix else name
        subs, listed = _submodels(f.annotation)
        if subs:
            for sub in subs:
                yield from walk(sub, here + ("[]" if listed else ""))
            continue
        kind, unit = _kind(f.annotation)
        yield Key(here, kind, unit, _default(f), _description(cls, name, f))


def _sections(cls: type[pydantic.BaseModel]) -> Iterator[tuple[str, type[pydantic.BaseModel]]]:
    """Each section (nested model) under ``cls`` with its key prefix, depth first."""
    for name, f in cls.model_fields.items():
        subs, listed = _submodels(f.annotation)
        for sub in subs:
            yield name + ("[]" if listed else ""), sub
            for inner, model in _sections(sub):
                yield f"{name}{'[]' if listed else ''}.{inner}", model


def _shipped_owners() -> dict[str, set[str]]:
    """Key pattern -> the tests (module::function) that judge it in the shipped profiles: for the
    owners that depend on the entry (one collective check, one SFT case), by example."""
    from pytest_gpucluster.checks.fail_closed import profile_thresholds
    from pytest_gpucluster.profiles.loader import load_profile
    from pytest_gpucluster.profiles.paths import shipped_thresholds_dir

    out: dict[str, set[str]] = {}
    for path in sorted(shipped_thresholds_dir().glob("*.yaml")):
        if path.name.startswith("_") or path.stem == "devices":
            continue
        for t in profile_thresholds(load_profile(path.stem).model):
            pattern = "".join(
                "[]" if isinstance(p, int) else (f".{p}" if i else str(p))
                for i, p in enumerate(t.ref.key_path)
            )
            owners = {f"{o.module}::{o.function}" + ("[…]" if o.param else "") for o in t.owners}
            out.setdefault(pattern, set()).update(owners)
    return out


_GRAIN = {"gpu": "per GPU", "node": "per node", "cluster": "once for the cluster"}
"""Where a threshold must have a value (``checks.fail_closed_owners.Rule.grain``)."""


def owners_of() -> dict[str, str]:
    """Key pattern -> who judges it and where it must be measured, as the page prints it."""
    from pytest_gpucluster.checks import fail_closed
    from pytest_gpucluster.checks.nccl import EXPECTATIONS

    shipped = _shipped_owners()
    out: dict[str, str] = {}
    for key, rule in fail_closed.OWNERS.items():
        owners = getattr(rule, "owners", rule)
        try:
            found = {str(o) for o in owners(None, ())}  # type: ignore[arg-type]
        except (AttributeError, TypeError, IndexError, ValueError, AssertionError):
            found = {o for pattern, names in shipped.items() if pattern.startswith(key) for o in names}
        text = ", ".join(code(o) for o in sorted(found)) or "per entry: `checks/fail_closed_owners.py`"
        grain = _GRAIN.get(getattr(rule, "grain", ""), "")
        out[key] = f"{text} ({grain})" if grain else text
    for name in EXPECTATIONS:
        out[f"nccl.{name}"] = code(f"test_nccl.py::test_nccl_expectation[{name}]") + " (once for the cluster)"
    return out


def _settings_note(key: str) -> str:
    from pytest_gpucluster.checks.fail_closed import NOT_THRESHOLDS

    return "setting" if key in NOT_THRESHOLDS else ""


def render_profile_keys() -> str:
    from pytest_gpucluster.profiles.schema import ProfileModel

    owners = owners_of()
    keys = list(walk(ProfileModel))
    out = [
        GENERATED,
        "# Profile keys\n",
        "Every key a hardware profile (`thresholds/<name>.yaml`) may set, from the schema the loader "
        "validates against (an unknown key is refused, naming its file and line). Quantities are "
        "written with their unit and read into the canonical one: "
        + "; ".join(f"{kind} in {unit or 'a bare number'} ({how})" for kind, unit, how in _uniq_units())
        + ". The format, with a complete example: [Profile format](profile-format.md).\n",
        "**Judged by** names the tests that judge a threshold, and where it must have a value: per "
        "GPU, per node, or once for the cluster. At the end of a session every threshold the profile "
        "sets must have a value from one of them there, or the run fails it as NOT MEASURED (see [Fail closed](../explanation/fail-closed.md)); `[…]` is one parameter per "
        "entry of the list. A key with no test is a setting: it shapes the work, nothing is judged "
        "against it.\n",
        f"{len(keys)} keys, {sum(k.key in owners for k in keys)} of them thresholds.\n",
    ]
    top_level = [k for k in keys if "." not in k.key]
    out.append("## Top level\n")
    out.append(_table(top_level, owners))
    for prefix, model in _sections(ProfileModel):
        mine = [k for k in keys if k.key.rsplit(".", 1)[0] == prefix]
        if not mine:
            continue
        out.append(f"\n## `{prefix}`\n")
        if model.__doc__ and model.__doc__ is not pydantic.BaseModel.__doc__:
            out.append(cell(model.__doc__) + "\n")
        out.append(_table(mine, owners))
    return "\n".join(out)


def _uniq_units() -> list[tuple[str, str, str]]:
    seen: dict[str, tuple[str, str, str]] = {}
    for kind, unit, how in _UNITS.values():
        if kind not in ("environment", "tolerance"):
            seen.setdefault(kind, (kind, unit, how))
    return list(seen.values())


def _table(keys: list[Key], owners: dict[str, str]) -> str:
    rows = []
    for k in keys:
        kind = cell(k.kind) + (f" ({k.unit})" if k.unit and k.unit not in k.kind else "")
        rows.append(
            (
                code(k.key),
                f"{kind}; " + ("required" if k.default == "required" else f"default {k.default}"),
                owners.get(k.key, _settings_note(k.key)),
                cell(k.description),
            )
        )
    return table(("key", "type; default", "judged by", "meaning"), rows)
