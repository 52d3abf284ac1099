"""Parsing an untrusted JSON body: the one place where intake and callbacks turn bytes into Python values.

``json.loads`` alone lets three things through that fail later, far from the request: nesting deep
enough to raise ``RecursionError`` (a 500 instead of a 400), and strings holding a lone UTF-16
surrogate (the escape ``"\\ud800"``), which no database encoding can store, so one such string would
make every transaction that writes it fail. :func:`load_json` refuses all of these with a
:class:`JsonRefused` naming the problem and, for text, the path of the first bad string.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "JsonRefused", "bad_unicode_path", "load_json"]

# GitHub's webhook payloads nest about 8 levels and conformance reports 5; 64 is far above both.
MAX_JSON_DEPTH = 64


class JsonRefused(ValueError):
    """The body is not JSON the relay accepts; ``code`` is ``invalid_json`` or ``invalid_unicode``."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code, self.detail = code, detail


def _is_valid_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def bad_unicode_path(value: Any) -> str | None:
    """The dotted path of the first string (key or value) in ``value`` that is not valid Unicode, else None.

    Walks with an explicit stack (no recursion); callers run it only after a fast whole-value check failed.
    """
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if not _is_valid_text(item):
                return path or "<body>"
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                child_path = f"{path}.{key}" if path else str(key)
                if not _is_valid_text(key):
                    return (path + "." if path else "") + ascii(key)
                stack.append((child_path, child))
        elif isinstance(item, list):
            for index in range(len(item) - 1, -1, -1):
                stack.append((f"{path}.{index}" if path else str(index), item[index]))
    return None


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth > MAX_JSON_DEPTH:
                return depth
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def load_json(body: bytes) -> Any:
    """load_json(body) -> the parsed value; raises JsonRefused for bad JSON, deep nesting or invalid Unicode."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise JsonRefused("invalid_json", f"the JSON nests deeper than {MAX_JSON_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise JsonRefused("invalid_json", f"body is not valid JSON: {exc}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise JsonRefused("invalid_json", f"the JSON nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        # Fast path: one C-level pass; only a failure pays for the walk that names the field.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        path = bad_unicode_path(value)
        raise JsonRefused(
            "invalid_unicode",
            f"field {path!r} is not valid Unicode (a lone UTF-16 surrogate such as \\ud800); send UTF-8 text",
        ) from None
    return value
