"""`make prod`'s credentials (jobsite/provision.py) against this machine's PostgreSQL and Redis, with a throwaway
installation directory: a role that is no superuser and owns only its database, a Redis ACL user confined to its
installation's prefix, both kept beside secret-key (mode 0600) and the same on a second run."""

import os
import secrets

import psycopg
import pytest
import redis
from psycopg import sql

from jobsite import provision

ADMIN_PG = "postgres://postgres@127.0.0.1:5432/postgres"
ADMIN_REDIS = "redis://127.0.0.1:6379/14"


def admin(database: str = "postgres") -> psycopg.Connection:
    return psycopg.connect(f"postgres://postgres@127.0.0.1:5432/{database}", autocommit=True)


@pytest.fixture
def installation(tmp_path):
    """(var dir, installation id, database); the role, databases and ACL user are removed afterwards."""
    inst = f"t{os.getpid()}{secrets.token_hex(3)}"
    database, other = f"jobsite_prov_{inst}", f"jobsite_prov_other_{inst}"
    with admin() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(other)))
    with admin(other) as conn:  # another installation's data, owned by the administrator
        conn.execute("CREATE TABLE secrets (value text)")
        conn.execute("INSERT INTO secrets VALUES ('not yours')")
    yield tmp_path / "var", inst, database, other
    with admin() as conn:
        for name in (database, other):
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(provision.role_name(inst))))
    client = redis.Redis.from_url(ADMIN_REDIS)
    client.execute_command("ACL", "DELUSER", provision.redis_user_name(inst))
    for key in client.scan_iter(f"jobsite:{inst}:*"):
        client.delete(key)
    client.close()


def test_the_role_owns_only_its_database_and_keeps_its_password(installation):
    var, inst, database, other = installation
    url = provision.postgres_role(var_dir=var, admin_url=ADMIN_PG, database=database, installation=inst)
    role = provision.role_name(inst)
    assert url.startswith(f"postgres://{role}:") and url.endswith(f"@127.0.0.1:5432/{database}")
    assert (var / "db-password").stat().st_mode & 0o777 == 0o600

    with admin() as conn:
        flags = conn.execute("SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls, rolcanlogin "
                             "FROM pg_roles WHERE rolname = %s", [role]).fetchone()
        assert flags == (False, False, False, False, False, True)
        owned = conn.execute("SELECT datname FROM pg_database WHERE pg_get_userbyid(datdba) = %s", [role]).fetchall()
        assert owned == [(database,)]
        assert role != "postgres"

    # It works in its database: creates, writes, reads.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE mine (n int)")
        conn.execute("INSERT INTO mine VALUES (1)")
        assert conn.execute("SELECT n FROM mine").fetchall() == [(1,)]
        assert conn.execute("SELECT current_user").fetchone() == (role,)
    # Elsewhere it reads nothing, and cannot make itself more.
    with psycopg.connect(url.rsplit("/", 1)[0] + f"/{other}", autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM secrets")
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE planted (n int)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT rolpassword FROM pg_authid")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql.SQL("ALTER ROLE {} SUPERUSER").format(sql.Identifier(role)))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("COPY (SELECT 1) TO PROGRAM 'true'")
    # Other roles may not even connect to its database.
    with admin() as conn:
        acl = conn.execute("SELECT datacl::text FROM pg_database WHERE datname = %s", [database]).fetchone()[0]
    assert acl == f"{{{role}=CTc/{role}}}"

    # Again (every start): the same password, the table it made still its own.
    password = (var / "db-password").read_text()
    assert provision.postgres_role(var_dir=var, admin_url=ADMIN_PG, database=database, installation=inst) == url
    assert (var / "db-password").read_text() == password
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT n FROM mine").fetchall() == [(1,)]


def test_objects_an_earlier_run_made_as_postgres_are_handed_over(installation):
    var, inst, database, _ = installation
    with admin() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    with admin(database) as conn:  # `make prod` before this change migrated as postgres
        conn.execute("CREATE TABLE jobs_job (id bigserial PRIMARY KEY, name text)")
        conn.execute("CREATE SEQUENCE loose_seq")
        conn.execute("CREATE VIEW job_names AS SELECT name FROM jobs_job")
        conn.execute("INSERT INTO jobs_job (name) VALUES ('old')")
    url = provision.postgres_role(var_dir=var, admin_url=ADMIN_PG, database=database, installation=inst)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO jobs_job (name) VALUES ('new')")  # the table and its sequence
        assert conn.execute("SELECT name FROM job_names ORDER BY 1").fetchall() == [("new",), ("old",)]
        assert conn.execute("SELECT nextval('loose_seq')").fetchone() == (1,)
        conn.execute("ALTER TABLE jobs_job ADD COLUMN extra int")  # a later migration


def test_the_redis_user_is_confined_to_its_installation(installation):
    var, inst, _, _ = installation
    url = provision.redis_user(var_dir=var, admin_url=ADMIN_REDIS, installation=inst)
    assert url.startswith(f"redis://{provision.redis_user_name(inst)}:") and url.endswith("@127.0.0.1:6379/14")
    assert (var / "redis-password").stat().st_mode & 0o777 == 0o600
    mine = redis.Redis.from_url(url)
    try:
        mine.set(f"jobsite:{inst}:cache:x", "1")
        assert mine.get(f"jobsite:{inst}:cache:x") == b"1"
        mine.publish(f"jobsite:{inst}:ws:__group__jobs.all", "hello")
        for denied in (lambda: mine.get("jobsite:someone-else:cache:x"), lambda: mine.set("celery", "x"),
                       lambda: mine.publish("jobsite:someone-else:ws:__group__jobs.all", "forged"),
                       lambda: mine.flushall(), lambda: mine.config_get("*"), lambda: mine.keys("*"),
                       lambda: mine.execute_command("ACL", "LIST")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                denied()
    finally:
        mine.close()
    with pytest.raises(redis.exceptions.AuthenticationError):  # the password is checked
        redis.Redis.from_url(url.replace(":" + url.split(":")[2].split("@")[0] + "@", ":wrong@")).ping()
    # Again (every start, Redis may have restarted): the same password still works.
    assert provision.redis_user(var_dir=var, admin_url=ADMIN_REDIS, installation=inst) == url
    assert redis.Redis.from_url(url).ping()


def test_the_command_prints_exports_and_keeps_the_files(installation, capsys, monkeypatch):
    var, inst, database, _ = installation
    monkeypatch.delenv("JOBSITE_INSTALLATION_ID", raising=False)
    monkeypatch.delenv("JOBSITE_METRICS_TOKEN", raising=False)
    (var).mkdir(parents=True)
    (var / "installation-id").write_text(inst + "\n")
    assert provision.main(["--var-dir", str(var), "--database", database, "--postgres-admin-url", ADMIN_PG,
                           "--redis-admin-url", ADMIN_REDIS]) == 0
    first = capsys.readouterr().out
    lines = dict(line.removeprefix("export ").split("=", 1) for line in first.splitlines())
    assert set(lines) == {"JOBSITE_INSTALLATION_ID", "JOBSITE_METRICS_TOKEN", "DATABASE_URL", "REDIS_URL"}
    assert lines["JOBSITE_INSTALLATION_ID"] == inst
    assert lines["JOBSITE_METRICS_TOKEN"] == (var / "metrics-token").read_text().strip()
    assert (var / "metrics-token").stat().st_mode & 0o777 == 0o600
    provision.main(["--var-dir", str(var), "--database", database, "--postgres-admin-url", ADMIN_PG,
                    "--redis-admin-url", ADMIN_REDIS])
    assert capsys.readouterr().out == first  # idempotent
