"""Alembic revision scripts (a package so that the installed distribution carries them)."""
