"""Alembic migrations of the tuned-config database (run by ``spectune.db._writer``)."""
