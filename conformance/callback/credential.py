"""Who the callback says it is, and where it may say it: the ``Authorization`` value and the URLs it goes to.

The credential is ``Token <RELAY_CALLBACK_TOKEN>`` (a static token) or ``Bearer <OIDC token>`` fetched for
``RELAY_AUDIENCE`` from ``ACTIONS_ID_TOKEN_REQUEST_URL`` with ``ACTIONS_ID_TOKEN_REQUEST_TOKEN``. It is only
ever sent over ``https``: ``http://`` would carry it in clear text and ``file://`` would read a local file
(and print it in the error). ``RELAY_CALLBACK_ALLOW_HTTP_LOOPBACK=1`` lets plain ``http`` through to a
loopback address only, for tests and local trials (a relay on 127.0.0.1).

Every secret is checked before it is used or masked: it must be printable ASCII. A newline, another
control character (C1 ones too) or a Unicode line separator would defeat ``::add-mask::`` (it masks one
line) and make urllib raise with the header in its message.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping

from conformance.callback.transport import CallbackFailed, RetryPolicy, request, with_retries
from conformance.callback.workflow_log import mask

ALLOW_HTTP_LOOPBACK = "RELAY_CALLBACK_ALLOW_HTTP_LOOPBACK"
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def checked_url(url: str, setting: str, env: Mapping[str, str]) -> str:
    """``url`` when the credential may go there: ``https``, or ``http`` to loopback with the switch on.

    The error names the setting and the scheme and host only (a URL's query may hold a token)."""
    parts = urllib.parse.urlsplit(url)
    scheme, host = parts.scheme.lower(), parts.hostname or ""
    if scheme == "https" and host:
        return url
    loopback_allowed = env.get(ALLOW_HTTP_LOOPBACK, "").strip().lower() in ("1", "true", "yes")
    if scheme == "http" and host in _LOOPBACK_HOSTS and loopback_allowed:
        return url
    if scheme == "http" and host in _LOOPBACK_HOSTS:
        hint = f"set {ALLOW_HTTP_LOOPBACK}=1 to allow plain http to a loopback relay (tests only)"
    else:
        hint = "use the https:// address"
    shown = f"{scheme}://{host}" if scheme else repr(url[:40])
    raise CallbackFailed(f"{setting} must be an https:// URL, not {shown}: the credential would travel "
                         f"unprotected; {hint}")


def _unprintable(char: str) -> str | None:
    """What ``char`` is, when a credential may not hold it (anything but printable ASCII); else None."""
    code = ord(char)
    if char in "\r\n":
        return "a newline"
    if code < 0x20 or 0x7F <= code <= 0x9F:  # C0 and C1 controls, DEL
        return f"the control character U+{code:04X}"
    if code > 0x7F:  # a line or paragraph separator among them: a log reader may end the line there
        return f"the non-ASCII character U+{code:04X}"
    return None


def checked_secret(name: str, value: str) -> str:
    """``value`` when it is one line of printable ASCII; else CallbackFailed naming ``name`` (never the value)."""
    for position, char in enumerate(value):
        what = _unprintable(char)
        if what is not None:
            raise CallbackFailed(f"{name} contains {what} at position {position}: a credential is one line of "
                                 "printable ASCII; remove the trailing newline or stray character from the secret")
    return value


def credential(env: Mapping[str, str], policy: RetryPolicy, timeout: float = 30.0) -> str:
    """The ``Authorization`` header value: ``Token <RELAY_CALLBACK_TOKEN>``, else ``Bearer <OIDC token>``."""
    static = env.get("RELAY_CALLBACK_TOKEN", "")
    if static:
        mask(checked_secret("RELAY_CALLBACK_TOKEN", static))
        return f"Token {static}"
    url, request_token = env.get("ACTIONS_ID_TOKEN_REQUEST_URL", ""), env.get("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "")
    if not url or not request_token:
        raise CallbackFailed(
            "no credential: ACTIONS_ID_TOKEN_REQUEST_URL/_TOKEN are unset (give the job 'permissions: id-token: write') "
            "and RELAY_CALLBACK_TOKEN is empty"
        )
    mask(checked_secret("ACTIONS_ID_TOKEN_REQUEST_TOKEN", request_token))
    checked_url(url, "ACTIONS_ID_TOKEN_REQUEST_URL", env)
    audience = env.get("RELAY_AUDIENCE", "")
    if not audience:
        raise CallbackFailed("RELAY_AUDIENCE is empty: set it to the relay's RELAY_OIDC_AUDIENCE")
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.urlencode([*urllib.parse.parse_qsl(parts.query), ("audience", audience)])
    token_url = urllib.parse.urlunsplit(parts._replace(query=query))
    headers = {"Authorization": f"bearer {request_token}", "Accept": "application/json"}
    answer, _ = with_retries("OIDC token request", lambda: request("GET", token_url, headers, None, timeout), policy)
    if answer.status != 200:
        raise CallbackFailed(f"OIDC token request refused: {answer.describe()}")
    token = answer.json().get("value")
    if not isinstance(token, str) or not token:
        raise CallbackFailed("OIDC token request answered without a token ('value' missing or empty)")
    mask(checked_secret("the OIDC token", token))
    return f"Bearer {token}"
