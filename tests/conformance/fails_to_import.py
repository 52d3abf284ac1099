"""A module that raises as it is imported: a fork server told to import it for its ranks must leave it to them."""

raise RuntimeError("fails_to_import refuses to import")
