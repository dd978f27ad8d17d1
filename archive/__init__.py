"""The durable record of finished jobs (docs/archive.md): a relational archive (SQLAlchemy, Alembic
migrations; SQLite in the data directory by default, PostgreSQL by URL), the archiver that copies a
finished job from Redis into it, the reads that answer with the API's own bodies, and the export of
reviewed boxes and masks for training."""
