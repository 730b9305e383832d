"""Database access: engine and sessions, migrations."""
