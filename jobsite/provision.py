"""Credentials of one installation on this machine's PostgreSQL and Redis (``make prod``, ``scripts/run-prod.sh``).

Run once per start; every step is idempotent, and what it makes is kept beside ``secret-key`` in the installation's
directory ($JOBSITE_VAR_DIR), one file each, mode 0600, made once and reused:

- ``installation-id``: 12 random hex digits; the prefix ``jobsite:<id>:`` of every Redis key and channel the
  installation uses (``JOBSITE_INSTALLATION_ID``);
- ``db-password``: the password of the PostgreSQL role ``jobsite_<id>``, which owns the installation's database and
  nothing else: LOGIN, and NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS. Its database is taken from
  PUBLIC (no other role may connect but superusers); objects an earlier run made as another role are handed to it;
- ``redis-password``: the password of the Redis ACL user ``jobsite-<id>``, allowed only keys and pub/sub channels
  under ``jobsite:<id>:`` and no administrative or dangerous command (no CONFIG, FLUSHALL, KEYS, MONITOR, ACL ...).
  ACL users live in Redis's memory, so each run sets it again (same password);
- ``metrics-token``: the bearer token of ``/metrics`` (``JOBSITE_METRICS_TOKEN``).

The admin connections (``--postgres-admin-url``, ``--redis-admin-url``) are used only here, never by jobsite's
processes, which get the least-privileged URLs this prints as ``export NAME=value`` lines for the shell.

A password only helps when the server asks for it: a warning is printed when PostgreSQL lets the role in with a
wrong password (``trust`` in pg_hba.conf) or Redis's ``default`` user needs none.

    python -m jobsite.provision --var-dir var/prod --database jobsite_prod \\
        --postgres-admin-url postgres://postgres@127.0.0.1:5432/postgres --redis-admin-url redis://127.0.0.1:6379/1
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

# What jobsite's Redis user may not run, whatever keys it names.
REDIS_DENIED = ("-@admin", "-@dangerous")


def warn(text: str) -> None:
    print(f"provision: WARNING: {text}", file=sys.stderr)


def kept_secret(var_dir: Path, name: str, make=lambda: secrets.token_urlsafe(32)) -> str:
    """The content of ``var_dir/name``, made with ``make()`` (mode 0600) the first time."""
    path = Path(var_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        value = path.read_text().strip()
        if not value:
            raise SystemExit(f"provision: {path} is empty; delete it to make a new one") from None
        return value
    with os.fdopen(fd, "w") as f:
        f.write(make() + "\n")
    return path.read_text().strip()


def installation_id(var_dir: Path) -> str:
    return kept_secret(var_dir, "installation-id", lambda: secrets.token_hex(6))


def role_name(installation: str) -> str:
    return "jobsite_" + installation.lower().replace("-", "_")


def redis_user_name(installation: str) -> str:
    return "jobsite-" + installation


def _with_credentials(url: str, user: str, password: str, path: str | None = None) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{user}:{password}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path if path is None else path, "", ""))


# --- PostgreSQL --------------------------------------------------------------------------------------------------


def postgres_role(*, var_dir: Path, admin_url: str, database: str, installation: str) -> str:
    """Make (or bring back in line) the installation's role and database; returns the role's DATABASE_URL."""
    import psycopg
    from psycopg import sql

    role, password = role_name(installation), kept_secret(var_dir, "db-password")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin_role = admin.execute("SELECT current_user").fetchone()[0]
        if role in (admin_role, "postgres"):
            raise SystemExit(f"provision: refusing to use the administrative role {role!r} for jobsite")
        exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone()
        verb = "ALTER" if exists else "CREATE"
        # Password as a literal: utility statements take no parameters (it is URL-safe base64 anyway).
        admin.execute(sql.SQL("{} ROLE {} WITH LOGIN PASSWORD {} NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
                              "NOBYPASSRLS").format(sql.SQL(verb), sql.Identifier(role), sql.Literal(password)))
        db = sql.Identifier(database)
        if admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone():
            admin.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(db, sql.Identifier(role)))
        else:
            admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(db, sql.Identifier(role)))
        admin.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(db))
    _hand_over_objects(admin_url, database, role)
    url = _with_credentials(admin_url, role, password, path=f"/{database}")
    _warn_if_passwords_are_not_checked(url)
    return url


def _hand_over_objects(admin_url: str, database: str, role: str) -> None:
    """Give ``role`` the schema public and every table, view and sequence in it (an earlier `make prod` migrated
    as the administrative role). Sequences owned by a table follow their table."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(_with_database(admin_url, database), autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER SCHEMA public OWNER TO {}").format(sql.Identifier(role)))
        for kinds in (["r", "p", "v", "m", "f"], ["S"]):  # then the sequences no table took along
            relations = conn.execute(
                "SELECT c.relname, c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND c.relkind::text = ANY(%s) AND pg_get_userbyid(c.relowner) <> %s "
                "ORDER BY c.relname", [kinds, role]).fetchall()
            for name, kind in relations:
                statement = {"v": "ALTER VIEW", "m": "ALTER MATERIALIZED VIEW", "f": "ALTER FOREIGN TABLE",
                             "S": "ALTER SEQUENCE"}.get(kind, "ALTER TABLE")
                conn.execute(sql.SQL("{} {} OWNER TO {}").format(
                    sql.SQL(statement), sql.Identifier("public", name), sql.Identifier(role)))


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, ""))


def _warn_if_passwords_are_not_checked(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    wrong = _with_credentials(url, parts.username or "", "not-" + secrets.token_hex(8))
    try:
        psycopg.connect(wrong, connect_timeout=5).close()
    except psycopg.OperationalError:
        return
    warn(f"PostgreSQL at {parts.hostname}:{parts.port or 5432} lets {parts.username} in with a wrong password "
         "(trust in pg_hba.conf), so anything that reaches it can still log in as any role, postgres included: "
         "use scram-sha-256 for host connections on a server of your own (README, Running in production)")


# --- Redis -------------------------------------------------------------------------------------------------------


def redis_user(*, var_dir: Path, admin_url: str, installation: str) -> str:
    """Set the installation's ACL user (keys and channels under its prefix only); returns its REDIS_URL."""
    import redis

    user, password = redis_user_name(installation), kept_secret(var_dir, "redis-password")
    prefix = f"jobsite:{installation}:"
    client = redis.Redis.from_url(admin_url)
    db = client.connection_pool.connection_kwargs.get("db", 0)
    # PSUBSCRIBE is allowed only for patterns listed as they are: Celery's remote control (`celery inspect ping`,
    # the Kubernetes worker probe) subscribes to the pattern of its broadcast exchange (settings'
    # CELERY_BROKER_TRANSPORT_OPTIONS prefix, kombu's "/<db>." fanout prefix).
    pidbox = f"&{prefix}celery:/{db}.celery.pidbox"
    try:
        client.execute_command("ACL", "SETUSER", user, "reset", "on", f">{password}", f"~{prefix}*",
                               f"&{prefix}*", pidbox, "+@all", *REDIS_DENIED)
        default = client.execute_command("ACL", "GETUSER", "default")
    finally:
        client.close()
    flags = _acl_field(default, "flags")
    if "nopass" in flags and "on" in flags:
        warn("Redis lets anyone in as its `default` user without a password, so anything that reaches it can "
             "still read and write every key: on a Redis of your own, turn that user off or give it a password "
             "(README, Running in production)")
    return _with_credentials(admin_url, user, password)


def _acl_field(reply, name: str) -> list[str]:
    if isinstance(reply, dict):
        value = reply.get(name) or reply.get(name.encode()) or []
    else:
        items = list(reply or [])
        pairs = dict(zip(items[::2], items[1::2], strict=False))
        value = pairs.get(name) or pairs.get(name.encode()) or []
    return [v.decode() if isinstance(v, bytes) else str(v) for v in value]


# --- the command line ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Credentials of one jobsite installation (make prod).")
    parser.add_argument("--var-dir", type=Path, required=True)
    parser.add_argument("--database", default="jobsite_prod")
    parser.add_argument("--postgres-admin-url", default="", help="empty: keep DATABASE_URL as given")
    parser.add_argument("--redis-admin-url", default="", help="empty: keep REDIS_URL as given")
    args = parser.parse_args(argv)

    exports = {"JOBSITE_INSTALLATION_ID": os.environ.get("JOBSITE_INSTALLATION_ID") or installation_id(args.var_dir),
               "JOBSITE_METRICS_TOKEN": os.environ.get("JOBSITE_METRICS_TOKEN")
               or kept_secret(args.var_dir, "metrics-token")}
    installation = exports["JOBSITE_INSTALLATION_ID"]
    if args.postgres_admin_url:
        exports["DATABASE_URL"] = postgres_role(var_dir=args.var_dir, admin_url=args.postgres_admin_url,
                                                database=args.database, installation=installation)
    if args.redis_admin_url:
        exports["REDIS_URL"] = redis_user(var_dir=args.var_dir, admin_url=args.redis_admin_url,
                                          installation=installation)
    for name, value in exports.items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
