"""The HTTP plumbing every route shares: bounded body reading (``request_body``), untrusted JSON
(``json_input``), security headers on every response (``security_headers``), the listener's limits
(``serving``) and the operator's endpoints ``/healthz``, ``/readyz``, ``/metrics`` and ``/api/quarantine``
(``health``).

Nothing here knows a flow: intake, results and the dashboard import it, never the other way round.
"""
