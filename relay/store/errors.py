"""How database failures leave the store: as :class:`StoreUnavailable`, never as SQLAlchemy errors.

``guarded`` wraps every store method that touches the database, so callers can answer 503 without
knowing SQLAlchemy; constraint violations (``IntegrityError``) pass through for the caller to judge.
Intake's group commit tells the two apart per webhook: :class:`StoreUnavailable` (the database could not
answer: an outage, a time-out) or :class:`StoreRefused` (it answered, and refused this webhook's rows).
"""

from __future__ import annotations

import functools

from sqlalchemy import exc as sa_exc

__all__ = ["StoreRefused", "StoreUnavailable", "describe", "guarded", "is_outage"]


class StoreUnavailable(RuntimeError):
    """The database could not be reached or refused the transaction (nothing was written)."""


class StoreRefused(ValueError):
    """The database refused one item's rows (a constraint, a value out of range): the data is at fault,
    not the store, so retrying the same item cannot help. Nothing of that item was written."""


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not take the write (connection, time-out, lock wait,
    disk, schema), rather than that it refused these particular rows (a constraint, a value it cannot
    hold, or a Python-side error converting them)."""
    if isinstance(exc, sa_exc.TimeoutError):
        return True
    return isinstance(exc, sa_exc.DBAPIError) and not isinstance(exc, (sa_exc.DataError, sa_exc.IntegrityError))


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
