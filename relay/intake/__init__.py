"""Intake: a signed upstream webhook in, its delivery row and its outbox rows stored in one transaction.

``routes`` is ``POST /github/webhook``: the signature first, then the event normalised (``relay.intake.events``),
routed to backends (``relay.trust``) and handed to the store. The dispatcher (``relay.dispatch``) finds
the outbox rows by query; intake never calls it.
"""
