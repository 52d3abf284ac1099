"""Alembic environment: runs the relay's migrations on the connection that ``run_migrations`` passes in.

Triggered by ``relay.store.database.run_migrations`` (at every start-up) or by the ``alembic`` command
with ``-x url=...``. Reads ``relay.store.models`` (every table); writes the schema.
"""

from alembic import context
from sqlalchemy import create_engine

from relay.store.models import Base

target_metadata = Base.metadata


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:  # command line: alembic -x url=postgresql://... upgrade head
    from relay.store.database import normalise_url

    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        raise SystemExit("pass the database with: alembic -x url=<RELAY_DATABASE_URL> ...")
    with create_engine(normalise_url(url)).connect() as conn:
        _run(conn)
        conn.commit()
