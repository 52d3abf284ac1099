"""The app's parts as a route reads them: ``app_parts(request)``.

:func:`relay.app.create_app` keeps one record of the parts it built on the app (``app.state.parts``,
:class:`relay.assembly.RelayParts`). A route module says what it reads of that record in a ``Protocol`` of
its own and types ``app_parts`` by it, so routes never import the record, and the record can name every
service without an import circle.
"""

from __future__ import annotations

from typing import Any

__all__ = ["app_parts"]


def app_parts(where: Any) -> Any:
    """The parts of the app serving ``where`` (a request, or the app itself)."""
    app = where.app if hasattr(where, "scope") else where
    return app.state.parts
