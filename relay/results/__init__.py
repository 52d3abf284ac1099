"""Results: a downstream run's callbacks in, its state and test results stored, its check run or commit
status written upstream.

``routes`` (``POST /github/callback``) hands a verified caller (``oidc``) to ``receiver``, which moves the
run through its states (``relay.store.run_states``) and stores the report. ``reporter`` finds the runs whose
upstream state is out of date by query, decides what to show (``verdict``), words it (``summary``) and
writes it through ``relay.github``; ``sweeper`` times out runs whose callbacks never came.
"""
