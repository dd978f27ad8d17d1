"""The archive's schema revisions, oldest first (docs/archive.md § Migrations)."""
