"""Hostfiles: read DeepSpeed and Open MPI hostfiles, check them, write them back out.

Accepted, one host per line::

    # whole-line comment
    node01 slots=8                 # DeepSpeed; a trailing comment is fine
    node02 slots=8 max_slots=8     # Open MPI (max-slots is accepted too)
    node03:8                       # Open MPI / mpirun --host style
    alice@node04                   # a user, and no slot count: the launcher's default applies
    10.0.0.5

A host name becomes part of a command line (ssh, pdsh, mpirun), so anything that is not a
plain host name — spaces, ``;``, ``$``, quotes, a leading ``-`` — is refused here, before it
can reach one. Parsing is pure; :func:`read_hostfile` is the only function that touches a file.
Imports only the standard library and :mod:`pytest_gpucluster.errors`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pytest_gpucluster.errors import HostfileError

__all__ = [
    "HostEntry",
    "Hostfile",
    "hostfile_from_hosts",
    "hostfile_to_json",
    "hostname_problem",
    "parse_hostfile",
    "read_hostfile",
    "to_deepspeed",
    "to_openmpi",
]

_MAX_HOSTNAME = 253
_HOST_CHARS = re.compile(r"[A-Za-z0-9_.-]+")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_DIGITS = re.compile(r"[0-9]+")
# key as written -> field; Open MPI spells it both ways.
_KEYS = {"slots": "slots", "max_slots": "max_slots", "max-slots": "max_slots"}


@dataclass(frozen=True, slots=True)
class HostEntry:
    """One host line of a hostfile."""

    host: str
    """Host name or address, checked by :func:`hostname_problem`."""
    slots: int | None
    """Processes (GPUs) to start on the host; None when the line does not say."""
    max_slots: int | None
    """Open MPI's oversubscription cap; None when the line does not say."""
    user: str | None
    """Login user from ``user@host``; None for the current user."""
    line: int
    """1-based line number in the source, for messages."""

    def slots_or(self, default_slots: int) -> int:
        """The slot count of this host, or ``default_slots`` where the line gave none."""
        return self.slots if self.slots is not None else default_slots


@dataclass(frozen=True, slots=True)
class Hostfile:
    """A checked hostfile: at least one host, no duplicates, all names safe for a command line."""

    entries: tuple[HostEntry, ...]
    source: str = "<hostfile>"

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(entry.host for entry in self.entries)


def hostname_problem(name: str) -> str | None:
    """Why ``name`` is not a usable host name, or None when it is.

    Letters, digits, ``-``, ``.`` and ``_`` only (``_`` because Slurm node names use it); not
    starting with ``-`` (it would read as an option) or ``.``; no empty label; 253 characters at most.
    """
    if not name:
        return "the host name is empty"
    if not _HOST_CHARS.fullmatch(name):
        bad = next(ch for ch in name if not _HOST_CHARS.fullmatch(ch))
        return (
            f"host name {name!r} contains {bad!r}, which is not allowed in a host name "
            "(allowed: letters, digits, '-', '.', '_')"
        )
    if name[0] in "-.":
        return f"host name {name!r} starts with {name[0]!r}; a host name must start with a letter or digit"
    if ".." in name:
        return f"host name {name!r} has an empty label ('..')"
    if len(name) > _MAX_HOSTNAME:
        return f"host name {name[:20]!r}... is {len(name)} characters long; the limit is {_MAX_HOSTNAME}"
    return None


def _positive_int(text: str, key: str, where: str) -> int:
    if not _DIGITS.fullmatch(text) or int(text) == 0:
        raise HostfileError(f"{where}: {key} must be a positive integer, got {text!r}")
    return int(text)


def _parse_line(body: str, where: str, lineno: int) -> HostEntry:
    head, *options = body.split()
    user: str | None = None
    slots: int | None = None
    max_slots: int | None = None

    if "=" in head:
        key = head.split("=", 1)[0]
        raise HostfileError(
            f"{where}: the line starts with {head!r}, a key=value option, but the first word must be "
            f"the host name (did you forget the host before {key}=?)"
        )
    if "@" in head:
        user, head = head.split("@", 1)
        if not _USER.fullmatch(user):
            raise HostfileError(f"{where}: user {user!r} in {user}@{head} is not a valid user name")
    if ":" in head:
        head, count = head.rsplit(":", 1)
        slots = _positive_int(count, "the slot count after ':'", where)
    problem = hostname_problem(head)
    if problem:
        raise HostfileError(f"{where}: {problem}")

    seen: set[str] = set()
    for option in options:
        if "=" not in option:
            raise HostfileError(
                f"{where}: unexpected {option!r} after host {head!r}; write one host per line, "
                "followed only by key=value options (slots=N, max_slots=M)"
            )
        key, value = option.split("=", 1)
        field_name = _KEYS.get(key)
        if field_name is None:
            close = difflib.get_close_matches(key, _KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise HostfileError(
                f"{where}: unknown key {key!r} for host {head!r}{hint}; known keys: slots, max_slots"
            )
        if field_name in seen or (field_name == "slots" and slots is not None):
            raise HostfileError(f"{where}: {field_name} is given twice for host {head!r}")
        seen.add(field_name)
        number = _positive_int(value, key, where)
        if field_name == "slots":
            slots = number
        else:
            max_slots = number

    if slots is not None and max_slots is not None and max_slots < slots:
        raise HostfileError(
            f"{where}: host {head!r} has max_slots={max_slots} below slots={slots}; "
            "max_slots must be at least slots"
        )
    return HostEntry(host=head, slots=slots, max_slots=max_slots, user=user, line=lineno)


def parse_hostfile(text: str, source: str = "<hostfile>") -> Hostfile:
    """Parse hostfile text; every problem raises :class:`HostfileError` naming ``source:line``."""
    entries = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        body = raw.split("#", 1)[0].strip()
        if body:
            entries.append(_parse_line(body, f"{source}:{lineno}", lineno))
    return _checked(entries, source, "line")


def _checked(entries: list[HostEntry], source: str, position: str) -> Hostfile:
    first: dict[str, int] = {}
    for entry in entries:
        if entry.host in first:
            raise HostfileError(
                f"{source}:{entry.line}: host {entry.host!r} is listed again (first at {position} "
                f"{first[entry.host]}); give each host once, with its total slots"
            )
        first[entry.host] = entry.line
    if not entries:
        raise HostfileError(f"{source}: no hosts found (the file is empty or holds only comments)")
    return Hostfile(entries=tuple(entries), source=source)


def read_hostfile(path: str | Path) -> Hostfile:
    """Read and parse the hostfile at ``path`` — the one place this module does I/O."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HostfileError(f"hostfile {path} does not exist") from None
    except IsADirectoryError:
        raise HostfileError(f"hostfile {path} is a directory, not a file") from None
    except UnicodeDecodeError as exc:
        raise HostfileError(f"hostfile {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise HostfileError(f"hostfile {path} cannot be read: {exc.strerror or exc}") from None
    return parse_hostfile(text, source=str(path))


def hostfile_from_hosts(
    hosts: Iterable[str], slots: int | None = None, source: str = "<host list>"
) -> Hostfile:
    """Build a checked Hostfile from bare host names (a Slurm allocation, ``--hosts a,b``).

    ``line`` of each entry is its 1-based position in ``hosts``.
    """
    if slots is not None:
        _check_positive(slots, "slots")
    entries = []
    for position, host in enumerate(hosts, start=1):
        problem = hostname_problem(host)
        if problem:
            raise HostfileError(f"{source}:{position}: {problem}")
        entries.append(HostEntry(host=host, slots=slots, max_slots=None, user=None, line=position))
    return _checked(entries, source, "position")


def _check_positive(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HostfileError(f"{name} must be a positive integer, got {value!r}")


def _login(entry: HostEntry) -> str:
    return f"{entry.user}@{entry.host}" if entry.user else entry.host


def to_deepspeed(hostfile: Hostfile, default_slots: int) -> str:
    """DeepSpeed's format: ``host slots=N`` per line, ``default_slots`` where none was given."""
    _check_positive(default_slots, "default_slots")
    return "".join(f"{_login(e)} slots={e.slots_or(default_slots)}\n" for e in hostfile.entries)


def to_openmpi(hostfile: Hostfile, default_slots: int) -> str:
    """Open MPI's format: ``host slots=N [max_slots=M]`` per line."""
    _check_positive(default_slots, "default_slots")
    lines = []
    for entry in hostfile.entries:
        slots = entry.slots_or(default_slots)
        line = f"{_login(entry)} slots={slots}"
        if entry.max_slots is not None:
            if entry.max_slots < slots:
                raise HostfileError(
                    f"{hostfile.source}:{entry.line}: host {entry.host!r} has max_slots={entry.max_slots} "
                    f"below the default slots={slots}; give the line its own slots="
                )
            line += f" max_slots={entry.max_slots}"
        lines.append(line + "\n")
    return "".join(lines)


def hostfile_to_json(hostfile: Hostfile) -> list[dict[str, str | int | None]]:
    """Plain JSON for the CLI: one ``{"host", "slots", "max_slots", "user"}`` object per host."""
    return [
        {"host": e.host, "slots": e.slots, "max_slots": e.max_slots, "user": e.user} for e in hostfile.entries
    ]
