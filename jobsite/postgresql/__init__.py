"""Django's PostgreSQL backend with the pool's check of jobsite.dbpool (settings: DATABASES' ENGINE)."""
