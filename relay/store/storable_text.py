"""Text both stores can hold: the one rule for U+0000, and naming the field a database refused.

PostgreSQL cannot hold the character U+0000 (NUL) in a text column, nor in a query's parameter; SQLite
can. Rather than let one NUL in a report message, a PR title or a comment make every transaction that
carries it fail on one store and not the other, the store applies one rule to every string parameter
of every statement, on both stores: **U+0000 is written, and looked for, as U+FFFD** (the Unicode
replacement character). Nothing else of the text changes; a value is never refused for holding one.
Lone UTF-16 surrogates, the other text no database can store, never get this far
(:mod:`relay.web.json_input` refuses them at parsing, naming the field).

A value the database still refuses (longer than its column, out of its type's range) is named by
:func:`refused_field`: the column, its bound and the value's length, never the value itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine, String, event

__all__ = ["NUL", "REPLACEMENT", "install", "refused_field", "storable"]

NUL = "\x00"
REPLACEMENT = "\ufffd"


def storable(value: Any) -> Any:
    """The value as the store writes it: a string with every U+0000 replaced by U+FFFD, else unchanged."""
    if isinstance(value, str) and NUL in value:
        return value.replace(NUL, REPLACEMENT)
    return value


def _parameters(parameters: Any) -> Any:
    if isinstance(parameters, Mapping):
        if not any(isinstance(v, str) and NUL in v for v in parameters.values()):
            return parameters
        return {key: storable(value) for key, value in parameters.items()}
    if isinstance(parameters, tuple):
        if not any(isinstance(v, str) and NUL in v for v in parameters):
            return parameters
        return tuple(storable(value) for value in parameters)
    if isinstance(parameters, list):  # executemany: one set of parameters per row
        return [_parameters(row) for row in parameters]
    return parameters


def install(engine: Engine) -> None:
    """Apply the rule to every statement ``engine`` runs (writes and reads alike, so a lookup of a
    value holding U+0000 finds the row written from it)."""

    @event.listens_for(engine, "before_cursor_execute", retval=True)
    def _storable_parameters(_conn, _cursor, statement, parameters, _context, _executemany):
        return statement, _parameters(parameters)


_BIND_SUFFIX = re.compile(r"(_m?\d+)+$")


def _bounded_columns(metadata) -> dict[str, list[tuple[str, int]]]:
    """column name -> [(table, length)] for every String column with a length."""
    bounded: dict[str, list[tuple[str, int]]] = {}
    for table in metadata.tables.values():
        for column in table.columns:
            if isinstance(column.type, String) and column.type.length:
                bounded.setdefault(column.name, []).append((table.name, column.type.length))
    return bounded


def refused_field(exc: BaseException, metadata) -> str | None:
    """Which field of the refused statement did not fit, as ``table.column (at most N characters, got M)``,
    or None when no parameter is over its column's bound. Reads the statement's parameters, never prints them."""
    parameters = getattr(exc, "params", None)
    statement = str(getattr(exc, "statement", "") or "")
    rows = parameters if isinstance(parameters, list) else [parameters]
    bounded = _bounded_columns(metadata)
    for row in rows:
        if not isinstance(row, Mapping):
            continue
        for key, value in row.items():
            if not isinstance(value, str):
                continue
            name = _BIND_SUFFIX.sub("", str(key))
            for table, length in bounded.get(name, ()):
                if len(value) > length and (table in statement or len(bounded[name]) == 1):
                    return f"{table}.{name} (at most {length} characters, got {len(value)})"
    return None
