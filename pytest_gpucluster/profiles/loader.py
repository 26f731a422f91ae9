"""Find, read and validate hardware profiles, merging ``extends:`` chains.

A profile name is looked up as ``<name>.yaml`` in the thresholds directories (``--thresholds-dir``
first, then the shipped ones); a value containing a path separator or ending in ``.yaml`` is a
path. Every error names the file, the key path, the line where YAML gives it, the bad value
and what was expected — a profile author fixes it without reading our code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.profiles.findings import KeyPath, format_key
from pytest_gpucluster.profiles.paths import shipped_thresholds_dir
from pytest_gpucluster.profiles.physics import check_profile
from pytest_gpucluster.profiles.schema import ProfileModel

__all__ = [
    "LoadedProfile",
    "find_profile",
    "format_key",
    "known_profiles",
    "load_profile",
    "shipped_thresholds_dir",
]


@dataclass(frozen=True, slots=True)
class LoadedProfile:
    """A validated profile and where it came from."""

    model: ProfileModel
    path: Path
    chain: tuple[Path, ...]
    """The file and the files it extends, child first."""
    sha256: str
    """Hash over every file of the chain: a changed threshold shows up in results.json."""
    warnings: tuple[str, ...] = ()
    """Physics warnings (a threshold close to the hardware's peak), each naming file, line and key."""

    @property
    def name(self) -> str:
        return self.model.name


def _search_dirs(extra: Iterable[Path]) -> list[Path]:
    dirs = [Path(d) for d in extra]
    shipped = shipped_thresholds_dir()
    if shipped not in dirs:
        dirs.append(shipped)
    return dirs


def known_profiles(extra_dirs: Iterable[Path] = ()) -> dict[str, Path]:
    """Profile name -> file, earlier directories winning (a user's dir overrides a shipped name)."""
    found: dict[str, Path] = {}
    for directory in _search_dirs(extra_dirs):
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.yaml")):
            # '_base' files are only for `extends:`; devices.yaml is data, not a profile
            if path.stem.startswith("_") or path.stem == "devices":
                continue
            found.setdefault(path.stem, path)
    return found


def find_profile(name_or_path: str, extra_dirs: Iterable[Path] = (), *, near: Path | None = None) -> Path:
    extra = list(extra_dirs)
    looks_like_path = "/" in name_or_path or name_or_path.endswith((".yaml", ".yml"))
    if looks_like_path:
        candidate = Path(name_or_path)
        if near is not None and not candidate.is_absolute():
            candidate = near.parent / candidate
        if candidate.is_file():
            return candidate
        raise ProfileError(f"profile file {name_or_path} does not exist")
    if near is not None:
        sibling = near.parent / f"{name_or_path}.yaml"
        if sibling.is_file():
            return sibling
    for directory in _search_dirs(extra):
        candidate = directory / f"{name_or_path}.yaml"
        if candidate.is_file():
            return candidate
    known = known_profiles(extra)
    names = ", ".join(sorted(known)) or "(none found)"
    dirs = ", ".join(str(d) for d in _search_dirs(extra))
    raise ProfileError(
        f"unknown hardware profile {name_or_path!r}. Known profiles: {names}. "
        f"Searched: {dirs}. Pass --hw=<name> or --hw=path/to/profile.yaml."
    )


def _line_map(node: yaml.Node, path: KeyPath = ()) -> dict[KeyPath, int]:
    """Key path -> 1-based line, from YAML's node tree (values' lines, keys' for mappings)."""
    lines: dict[KeyPath, int] = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            lines.update(_line_map(value_node, (*path, key)))
            lines[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines.update(_line_map(item, (*path, index)))
    return lines


@dataclass(frozen=True, slots=True)
class _RawProfile:
    path: Path
    data: dict[str, Any]
    lines: dict[KeyPath, int]


def _read(path: Path) -> _RawProfile:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"cannot read profile {path}: {exc.strerror or exc}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and context_mark is not None:
            problem += f" ({context}, which started at line {context_mark.line + 1})"
        raise ProfileError(f"{path}{where}: invalid YAML: {problem}") from None
    if data is None:
        raise ProfileError(
            f"{path}: the file is empty; expected a mapping with at least 'name' and 'description'"
        )
    if not isinstance(data, dict):
        raise ProfileError(
            f"{path}, line 1: the top level must be a mapping of sections (name, cluster, collectives, ...), "
            f"got a {type(data).__name__}"
        )
    return _RawProfile(path=path, data=data, lines=_line_map(node) if node is not None else {})


def _merge(base: Any, override: Any) -> Any:
    """Deep merge for ``extends:``: mappings merge key by key, anything else is replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _merge(base[key], value) if key in base else value
        return merged
    return override


def _owner(path_key: KeyPath, chain: Sequence[_RawProfile]) -> _RawProfile:
    """The file (child first) that defines the value at this key path. ``extends:`` replaces lists
    whole, so the file that holds a list owns every key inside it, even one it leaves unset."""
    for raw in chain:
        node: Any = raw.data
        for part in path_key:
            if isinstance(node, list):
                return raw
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                break
        else:
            return raw
    return chain[0]


def _resolve_chain(path: Path, extra_dirs: Sequence[Path]) -> list[_RawProfile]:
    chain: list[_RawProfile] = []
    seen: list[Path] = []
    current: Path | None = path
    while current is not None:
        resolved = current.resolve()
        if resolved in seen:
            cycle = " -> ".join(str(p) for p in [*seen, resolved])
            raise ProfileError(f"{chain[-1].path}: 'extends' makes a cycle: {cycle}")
        seen.append(resolved)
        raw = _read(current)
        chain.append(raw)
        parent = raw.data.get("extends")
        if parent is None:
            current = None
            continue
        if not isinstance(parent, str) or not parent.strip():
            line = raw.lines.get(("extends",), 1)
            raise ProfileError(
                f"{raw.path}, line {line}, key 'extends': expected the name or path of another profile, "
                f"got {parent!r}"
            )
        try:
            current = find_profile(parent.strip(), extra_dirs, near=raw.path)
        except ProfileError as exc:
            line = raw.lines.get(("extends",), 1)
            raise ProfileError(f"{raw.path}, line {line}, key 'extends': {exc}") from None
    return chain


def load_profile(name_or_path: str, extra_dirs: Iterable[Path] = ()) -> LoadedProfile:
    """Find, merge and validate a profile; raise ProfileError with file/key/line on any problem."""
    dirs = list(extra_dirs)
    path = find_profile(name_or_path, dirs)
    chain = _resolve_chain(path, dirs)
    merged: dict[str, Any] = {}
    for raw in reversed(chain):
        merged = _merge(merged, raw.data)
    merged["extends"] = chain[0].data.get("extends")
    try:
        model = ProfileModel.model_validate(merged)
    except ValidationError as exc:
        raise ProfileError(_describe(exc, chain)) from None
    warnings = _check_physics(model, chain)
    digest = hashlib.sha256()
    for raw in chain:
        digest.update(raw.path.read_bytes())
    return LoadedProfile(
        model=model,
        path=path,
        chain=tuple(r.path for r in chain),
        sha256=digest.hexdigest(),
        warnings=warnings,
    )


def _check_physics(model: ProfileModel, chain: Sequence[_RawProfile]) -> tuple[str, ...]:
    """Raise on thresholds the hardware cannot meet; return the warnings, located like errors."""
    report = check_profile(model)

    def located(key: KeyPath, message: str) -> str:
        owner = _owner(key, chain)
        line = _nearest_line(key, owner.lines)
        where = f"{owner.path}, line {line}" if line else str(owner.path)
        return f"{where}, key '{format_key(key)}': {message}"

    if report.errors:
        problems = "\n  ".join(located(f.key, f.message) for f in report.errors)
        raise ProfileError(
            f"hardware profile {chain[0].path} asks for what its hardware cannot do:\n  {problems}"
        )
    return tuple(located(f.key, f.message) for f in report.warnings)


def _describe(exc: ValidationError, chain: Sequence[_RawProfile]) -> str:
    problems = []
    for error in exc.errors():
        loc: KeyPath = tuple(error["loc"])
        # pydantic appends union/validator tags to loc; keep only real key path parts
        loc = tuple(p for p in loc if isinstance(p, int) or not str(p).startswith(("function-", "nullable")))
        owner = _owner(loc, chain)
        line = _nearest_line(loc, owner.lines)
        where = f"{owner.path}, line {line}" if line else str(owner.path)
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = f"unknown key (allowed here: {_allowed_keys(loc[:-1])})"
        elif error["type"] == "missing":
            message = "required key is missing"
        value = error.get("input")
        shown = (
            ""
            if error["type"] in ("missing", "extra_forbidden") or isinstance(value, dict)
            else f" (got {value!r})"
        )
        problems.append(f"{where}, key '{format_key(loc)}': {message}{shown}")
    head = f"invalid hardware profile {chain[0].path}"
    return head + ":\n  " + "\n  ".join(problems)


def _nearest_line(loc: KeyPath, lines: dict[KeyPath, int]) -> int | None:
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in lines:
            return lines[loc[:cut]]
    return None


def _allowed_keys(parent: KeyPath) -> str:
    model: Any = ProfileModel
    for part in parent:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return "?"
        model = _model_of(field.annotation)
        if model is None:
            return "?"
    return ", ".join(model.model_fields)


def _model_of(annotation: Any) -> Any:
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None
