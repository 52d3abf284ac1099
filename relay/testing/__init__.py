"""Test helpers shipped with the relay, for its own tests and for backend owners' tests.

``FakeGitHub`` is a real HTTP server on 127.0.0.1 imitating the GitHub API endpoints the relay uses,
recording every request and scriptable with ``Fault``s. ``loopback_client()`` is the HTTP client to
reach it, or a relay under test, with.
"""

from relay.testing.fake_github import FakeGitHub, Fault, RecordedRequest
from relay.testing.loopback import loopback_client

__all__ = ["FakeGitHub", "Fault", "RecordedRequest", "loopback_client"]
