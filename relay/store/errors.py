"""How database failures leave the store: as :class:`StoreUnavailable`, never as SQLAlchemy errors.

``guarded`` wraps every store method that touches the database, so callers can answer 503 without
knowing SQLAlchemy; constraint violations (``IntegrityError``) pass through for the caller to judge.
"""

from __future__ import annotations

import functools

from sqlalchemy import exc as sa_exc

__all__ = ["StoreUnavailable", "describe", "guarded"]


class StoreUnavailable(RuntimeError):
    """The database could not be reached or refused the transaction (nothing was written)."""


def describe(exc: BaseException) -> str:
    """The driver's own error, in one line (no URL, so no password)."""
    cause = getattr(exc, "orig", None) or exc
    first_line = (str(cause).strip().splitlines() or [""])[0]
    return f"{type(cause).__name__}: {first_line}"


def guarded(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sa_exc.IntegrityError:
            raise
        except (sa_exc.DBAPIError, sa_exc.TimeoutError) as exc:
            raise StoreUnavailable(f"store {self.safe_url} unavailable: {describe(exc)}") from exc

    return wrapper
