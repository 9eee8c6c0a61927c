"""Storage: SQLAlchemy models, engine construction, migrations."""
