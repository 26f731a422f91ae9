"""``profiles check --strict``: every threshold says where its number comes from.

A threshold is sourced when any of these holds in the file that sets it (the child of an
``extends:`` chain when it overrides the parent):

1. a comment at the end of its line: ``min_busbw: 152GB/s  # azurehpc nd96asr_v4.conf x 2/3``;
2. a comment on the line directly above its key;
3. a comment on the line directly above the list item that holds it (a collectives check, an
   sft case);
4. a non-empty ``source:`` field in a mapping that holds it (a collectives check, an sft case,
   the scaling section).

Why both comments and ``source:`` fields: a ``source:`` field survives ``yaml.safe_load`` and
travels into results.json and the reports (in the hint of the check it sets), so it is the form
for checks, cases and scaling, which have one. Cluster figures, burn-in floors and NVLink settings
are plain ``key: value`` pairs; giving each a source field would turn every number into a
mapping. Those carry a comment, and comments are found without trusting a regex over the text:
``yaml.compose`` gives the line and column where every key and value ends, so a ``#`` inside a
quoted string is never taken for a comment, and a line is a comment line only if it is not the
inside of a block scalar. A section-level comment does not source the numbers below it: one
sentence above ``nvlink:`` cannot say where five different numbers come from.

What is a threshold (:func:`is_threshold`): every ``min_*``/``max_*`` key outside
``collectives.sweep`` (whose min/max_bytes are settings), the hardware figures the physics checks
hold thresholds against (``cluster.peak_flops, gpu_memory, memory_bandwidth, nvlink_bandwidth,
nic_line_rate, nics_per_node``), ``nvlink.links_per_gpu``, ``burnin.straggler_tolerance`` and
``straggler_min_excess``, every ``regression.tolerances[i].tolerance``, and every ``versions:`` pin.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pytest_gpucluster.profiles.findings import KeyPath, format_key

__all__ = ["Unsourced", "is_threshold", "unsourced_thresholds"]

_CLUSTER_FIGURES = frozenset(
    {"peak_flops", "gpu_memory", "memory_bandwidth", "nvlink_bandwidth", "nic_line_rate", "nics_per_node"}
)
_OTHER = {
    ("nvlink", "links_per_gpu"),
    ("burnin", "straggler_tolerance"),
    ("burnin", "straggler_min_excess"),
    ("regression", "tolerance"),
}


def is_threshold(path: KeyPath) -> bool:
    """Whether the value at ``path`` is a number a run is gated on (or a figure gates rest on)."""
    if len(path) < 2 or not isinstance(path[-1], str):
        return False
    key, section = path[-1], path[0]
    if section == "versions":
        return len(path) == 2
    if section == "cluster":
        return len(path) == 2 and key in _CLUSTER_FIGURES
    if section == "collectives" and path[1] == "sweep":
        return False
    if (section, key) in _OTHER:
        return True
    return key.startswith(("min_", "max_"))


@dataclass(frozen=True, slots=True)
class Unsourced:
    path: Path
    line: int
    key: KeyPath
    value: str

    def __str__(self) -> str:
        return (
            f"{self.path}, line {self.line}, key '{format_key(self.key)}': {self.value} has no source. Say where "
            "it comes from in a comment on its line or the line above, or in a source: field of its check, "
            "case or section (thresholds/README.md, 'Sources')."
        )


@dataclass(frozen=True, slots=True)
class _Entry:
    path: KeyPath
    key_node: yaml.Node
    value_node: yaml.ScalarNode
    holders: tuple[tuple[yaml.MappingNode, int | None], ...]
    """Enclosing mappings, innermost first, each with the line of its list item's dash (or None)."""


def _walk(
    node: yaml.Node, path: KeyPath, holders: tuple[tuple[yaml.MappingNode, int | None], ...]
) -> Iterator[_Entry]:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, key_node.value)
            if isinstance(value_node, yaml.ScalarNode):
                if is_threshold(child) and value_node.tag != "tag:yaml.org,2002:null":
                    yield _Entry(child, key_node, value_node, holders)
            elif isinstance(value_node, yaml.MappingNode):
                yield from _walk(value_node, child, ((value_node, None), *holders))
            else:
                yield from _walk(value_node, child, holders)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            if isinstance(item, yaml.MappingNode):
                yield from _walk(item, (*path, index), ((item, item.start_mark.line), *holders))
            else:
                yield from _walk(item, (*path, index), holders)


def _entries(root: yaml.Node) -> Iterator[_Entry]:
    if not isinstance(root, yaml.MappingNode):
        return
    for key_node, value_node in root.value:
        if isinstance(value_node, yaml.MappingNode):
            yield from _walk(value_node, (key_node.value,), ((value_node, None),))
        elif isinstance(value_node, yaml.SequenceNode):
            yield from _walk(value_node, (key_node.value,), ())


class _Text:
    """A file's lines with what YAML says about them: which lines are comments, where the last
    node on each line ends."""

    def __init__(self, text: str, root: yaml.Node) -> None:
        self.lines = text.splitlines()
        self.inside_scalar: set[int] = set()
        self.last_end: dict[int, int] = {}
        self._index(root)

    def _index(self, node: yaml.Node) -> None:
        if isinstance(node, yaml.ScalarNode):
            start, end = node.start_mark.line, node.end_mark.line
            self.inside_scalar.update(range(start + 1, end + 1))
            self._note_end(end, node.end_mark.column)
        elif isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            if node.flow_style:
                self._note_end(node.end_mark.line, node.end_mark.column)
            for child in node.value:
                for part in child if isinstance(child, tuple) else (child,):
                    self._index(part)

    def _note_end(self, line: int, column: int) -> None:
        self.last_end[line] = max(self.last_end.get(line, 0), column)

    def is_comment(self, line: int) -> bool:
        return (
            0 <= line < len(self.lines)
            and line not in self.inside_scalar
            and self.lines[line].lstrip().startswith("#")
        )

    def has_trailing_comment(self, line: int) -> bool:
        if not 0 <= line < len(self.lines) or line not in self.last_end:
            return False
        rest = self.lines[line][self.last_end[line] :].lstrip(" \t,}]")
        return rest.startswith("#")


def _has_source_field(mapping: yaml.MappingNode) -> bool:
    for key_node, value_node in mapping.value:
        if key_node.value == "source" and isinstance(value_node, yaml.ScalarNode):
            return bool(str(value_node.value).strip())
    return False


def _sourced(entry: _Entry, text: _Text) -> bool:
    if text.has_trailing_comment(entry.value_node.end_mark.line):
        return True
    if text.is_comment(entry.key_node.start_mark.line - 1):
        return True
    for mapping, item_line in entry.holders:
        if _has_source_field(mapping):
            return True
        if item_line is not None and text.is_comment(item_line - 1):
            return True
    return False


def _overridden(path: KeyPath, children: list[Any]) -> bool:
    """Whether a file earlier in the chain (a child) sets ``path``, or replaces a list or value
    that holds it (``extends:`` merges mappings key by key and replaces everything else)."""
    for data in children:
        node = data
        for part in path:
            if isinstance(node, dict) and part in node:
                node = node[part]
                if not isinstance(node, dict):
                    return True
            else:
                break
        else:
            return True
    return False


def unsourced_thresholds(chain: tuple[Path, ...]) -> tuple[Unsourced, ...]:
    """Every threshold in the files of an ``extends:`` chain (child first, as ``LoadedProfile.chain``)
    that no comment or source field explains; inherited values are judged in the file that sets them."""
    found: list[Unsourced] = []
    children: list[Any] = []
    for path in chain:
        raw = path.read_text(encoding="utf-8")
        root = yaml.compose(raw, Loader=yaml.SafeLoader)
        if root is None:
            continue
        text = _Text(raw, root)
        for entry in _entries(root):
            if _overridden(entry.path, children) or _sourced(entry, text):
                continue
            line = entry.key_node.start_mark.line
            found.append(
                Unsourced(path, line + 1, entry.path, f"{entry.key_node.value}: {entry.value_node.value}")
            )
        children.append(yaml.safe_load(raw))
    return tuple(found)
