"""Django's SQLite backend whose writers wait for each other in the process (settings: DATABASES' ENGINE)."""
