"""Alembic's environment for the archive (docs/archive.md § Migrations); run through archive.migrate."""
