"""Dispatch: outbox rows out as ``repository_dispatch`` calls, and re-runs back into the outbox.

``dispatcher`` claims due rows, sends them through ``relay.github`` under each credential's rate and
records the outcome and the run it starts; ``reruns`` turns re-run requests (a ``/retest`` comment, a
check run's re-run button) into new outbox rows and wakes the dispatcher.
"""
