"""The conformance suites, one module per area (``test_<suite>.py``; the suite name drops ``test_``)."""
