"""Alembic environment: runs migrations on the connection ``spectune.db`` hands in.

There is no ``alembic.ini``: ``spectune.db._writer.upgrade`` builds the configuration,
opens the transaction (locked against concurrent writers) and passes its connection
as ``config.attributes["connection"]``. Offline (SQL script) mode is not supported.
"""

from __future__ import annotations

from alembic import context

from spectune.db._backend import alter_in_batches
from spectune.db._models import Base

connection = context.config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise RuntimeError("spectune migrations run only through spectune.db (online)")
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=alter_in_batches(connection),
)
with context.begin_transaction():
    context.run_migrations()
