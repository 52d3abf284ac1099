"""Descriptor edits: a backend file's text with its level changed, or one quarantine entry removed, and
every other byte (comments, order, quoting, anchors, line ends) kept.

Used by the level-change proposals (:mod:`relay.levels.proposals`) on the text read from the descriptor
repository. ruamel.yaml's round-trip parser finds where the ``relay`` section's keys and entries are;
the edit replaces or removes only those lines, so nothing is re-emitted. The result is parsed again
and must equal the original with exactly the intended change (else :class:`DescriptorEditError`), so
an unusual layout can make an edit fail but never makes it change something else.
"""

from __future__ import annotations

import copy
import datetime as dt
import io
import re
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError as RoundTripError

__all__ = ["DescriptorEditError", "remove_quarantine_entry", "set_level"]

# A YAML scalar as written on a line: quoted, or plain up to a comment or the end of the line.
_SCALAR = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^']|'')*'|[^\s#][^#\n\r]*?(?=\s*(?:#|$))")


class DescriptorEditError(ValueError):
    """The descriptor cannot be edited as asked; the message names the file, the place and the fix."""


def _roundtrip(text: str, where: str) -> Any:
    try:
        return YAML(typ="rt").load(io.StringIO(text))
    except RoundTripError as exc:
        raise DescriptorEditError(f"{where}: not valid YAML: {exc}") from None


def _relay_section(text: str, where: str):
    data = _roundtrip(text, where)
    relay = data.get("relay") if hasattr(data, "get") else None
    if relay is None or not hasattr(relay, "lc"):
        raise DescriptorEditError(f"{where}: has no relay section to edit")
    if relay.fa.flow_style():
        raise DescriptorEditError(
            f"{where}: the relay section is written in flow style ({{...}}); write it as a block mapping "
            "(one key per line) so that a single line can change")
    return relay


def _plain(text: str, where: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DescriptorEditError(f"{where}: the edit left invalid YAML ({exc}); edit the file by hand") from None


def _checked(before: str, after: str, change, where: str) -> str:
    """``after`` if it parses to ``before`` with ``change`` applied, else DescriptorEditError."""
    expected = copy.deepcopy(_plain(before, where))
    change(expected["relay"])
    if _plain(after, where) != expected:
        raise DescriptorEditError(f"{where}: editing the relay section would change more than intended "
                                  "(an unusual layout); edit the file by hand")
    return after


def _replace_value(lines: list[str], line: int, column: int, value: str, where: str, key: str) -> None:
    text = lines[line]
    found = _SCALAR.match(text, column)
    if found is None:
        raise DescriptorEditError(f"{where}: line {line + 1}: relay.{key} is not a one-line value")
    lines[line] = text[:found.start()] + value + text[found.end():]


def _line_end(lines: list[str]) -> str:
    for line in lines:
        stripped = line.rstrip("\r\n")
        if stripped != line:
            return line[len(stripped):]
    return "\n"


def set_level(text: str, level: str, since: dt.date, *, where: str = "descriptor") -> str:
    """``text`` with ``relay.level`` set to ``level`` and ``relay.level_since`` to ``since`` (the new
    level's time at level starts then); a missing key is added as a line of the relay section."""
    relay = _relay_section(text, where)
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += _line_end(lines)
    newline = _line_end(lines)
    indent = " " * relay.lc.key(next(iter(relay)))[1]
    inserted: list[tuple[int, str]] = []
    for key, value in (("level", level), ("level_since", since.isoformat())):
        if key in relay:
            line, column = relay.lc.value(key)
            _replace_value(lines, line, column, value, where, key)
        else:
            # A new key goes right after the level line (or first in the section).
            after = relay.lc.key("level")[0] + 1 if "level" in relay else relay.lc.key(next(iter(relay)))[0]
            inserted.append((after, f"{indent}{key}: {value}{newline}"))
    for at, line_text in sorted(inserted, reverse=True):
        lines.insert(at, line_text)
    result = "".join(lines)
    if not text.endswith(("\n", "\r")):
        result = result[: len(result) - len(newline)] if result.endswith(newline) else result

    def change(section: dict) -> None:
        section["level"] = level
        section["level_since"] = since

    return _checked(text, result, change, where)


def _entry_lines(lines: list[str], first: int, dash_column: int) -> int:
    """The line after the last one of the sequence entry starting at ``first`` (blank and comment
    lines at its end belong to what follows, such as the next entry's comment)."""
    end = first + 1
    last_content = first + 1
    while end < len(lines):
        stripped = lines[end].strip()
        if stripped and not stripped.startswith("#"):
            if len(lines[end]) - len(lines[end].lstrip(" ")) <= dash_column:
                break
            last_content = end + 1
        end += 1
    return last_content


def remove_quarantine_entry(text: str, match: str, *, where: str = "descriptor") -> str:
    """``text`` without the ``relay.quarantine`` entry whose ``match`` is ``match`` (and without the
    ``quarantine`` key when it was the only entry). DescriptorEditError when there is no such entry."""
    relay = _relay_section(text, where)
    entries = relay.get("quarantine") or []
    index = next((i for i, e in enumerate(entries) if hasattr(e, "get") and e.get("match") == match), None)
    if index is None:
        raise DescriptorEditError(f"{where}: relay.quarantine has no entry with match {match!r}")
    if entries.fa.flow_style():
        raise DescriptorEditError(f"{where}: relay.quarantine is written in flow style ([...]); write one "
                                  "entry per '- ' line so that one entry can be removed")
    lines = text.splitlines(keepends=True)
    line, column = entries.lc.item(index)
    dash = lines[line].rfind("-", 0, column)
    if dash < 0 or lines[line][dash + 1:column].strip():
        raise DescriptorEditError(f"{where}: line {line + 1}: the quarantine entry does not start with '- ' "
                                  "on its own line; edit the file by hand")
    end = _entry_lines(lines, line, dash)
    if len(entries) == 1:  # the key goes too: an empty 'quarantine:' would read as null
        line, end = relay.lc.key("quarantine")[0], end
    del lines[line:end]

    def change(section: dict) -> None:
        kept = [e for e in section["quarantine"] if e.get("match") != match]
        if kept:
            section["quarantine"] = kept
        else:
            del section["quarantine"]

    return _checked(text, "".join(lines), change, where)
