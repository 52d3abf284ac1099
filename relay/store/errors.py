"""How database failures leave the store: as :class:`StoreUnavailable`, never as SQLAlchemy errors.

``guarded`` wraps every store method that touches the database, so callers can answer 503 without
knowing SQLAlchemy; constraint violations (``IntegrityError``) pass through for the caller to judge.
Intake's group commit tells the two apart per webhook: :class:`StoreUnavailable` (the database could not
answer: an outage, a time-out) or :class:`StoreRefused` (it answered, and refused this webhook's rows).
A value the database refuses (``DataError``: longer than its column, out of its type's range) is a
:class:`StoreRefused` naming the field everywhere (a 422 for the caller, never a 503): retrying it
cannot help, so it must not look like an outage.
"""

from __future__ import annotations

import functools

from sqlalchemy import exc as sa_exc

__all__ = ["StoreRefused", "StoreUnavailable", "describe", "guarded", "is_outage", "refusal"]


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


def refusal(exc: BaseException, subject: str = "a value", prefix: str = "") -> StoreRefused:
    """The :class:`StoreRefused` for rows the database refused, naming the field where it can."""
    from relay.store.base import Base
    from relay.store.storable_text import refused_field

    field = refused_field(exc, Base.metadata)
    named = f" (field {field})" if field else ""
    refused = StoreRefused(f"{prefix}the database refused {subject}{named}: {describe(exc)}")
    refused.__cause__ = exc
    return refused


def guarded(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sa_exc.IntegrityError:
            raise
        except sa_exc.DataError as exc:
            raise refusal(exc) from exc
        except (sa_exc.DBAPIError, sa_exc.TimeoutError) as exc:
            raise StoreUnavailable(f"store {self.safe_url} unavailable: {describe(exc)}") from exc

    return wrapper
