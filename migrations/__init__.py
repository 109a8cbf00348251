"""Alembic migrations of the FisherAtlas schema (run with ``atlas.db.upgrade`` or ``alembic upgrade head``)."""
