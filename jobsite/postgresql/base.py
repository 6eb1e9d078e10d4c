"""Django's PostgreSQL backend, whose connection pool checks connections with jobsite.dbpool.check_connection.

Django builds the pool itself and passes psycopg_pool's plain check when CONN_HEALTH_CHECKS is on (a `check` of
our own in the pool options would be a second keyword), so the pool it built gets ours in its place.
"""

from django.db.backends.postgresql import base

from jobsite import dbpool


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self):
        pool = super().pool
        if pool is not None and pool._check is not None and pool._check is not dbpool.check_connection:
            pool._check = dbpool.check_connection  # psycopg_pool keeps the `check` it was given there
        return pool
