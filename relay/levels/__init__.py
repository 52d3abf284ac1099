"""Levels: each backend measured against its trust level's criteria, and what follows from it.

``review`` measures and recommends, ``watch`` holds a backend found below its level's bar,
``proposals`` opens level changes and quarantine releases as pull requests on the descriptor
repository (their text edited by ``descriptor_text``), ``allowlist_reload`` applies edited descriptors
while the relay runs, and ``commands`` is ``relay levels review|propose|restore``.
"""
