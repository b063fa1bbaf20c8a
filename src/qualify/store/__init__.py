"""The results database: SQLAlchemy 2 models, engine set-up and queries."""
