"""The embedded default's SQLite backend (``jobsite.sqlite3``): the writers of one process queue on a lock of its
own, so a writer waits until the one before it is done, never in SQLite's sleeping retries; readers never wait."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from jobsite.sqlite3 import base
from tests.waiting import wait_for

pytestmark = [pytest.mark.fast, pytest.mark.django_db]


class CountingLock:
    """The process's writer lock for one file, counting the writers that wait for it."""

    def __init__(self) -> None:
        self.lock, self.waiting = threading.Lock(), 0

    def acquire(self, timeout: float = -1) -> bool:
        if not self.lock.acquire(blocking=False):
            self.waiting += 1
            return self.lock.acquire(timeout=timeout)
        return True

    def release(self) -> None:
        self.lock.release()

    def locked(self) -> bool:
        return self.lock.locked()


@pytest.fixture
def sqlite_file(tmp_path, monkeypatch):
    """A new SQLite file with a table, its writer lock counting; ``open()`` gives a connection to it as settings
    make them (IMMEDIATE transactions), but with SQLite's own busy timeout at 0: a writer that met SQLite's lock
    would fail at once instead of waiting."""
    name = str(tmp_path / "writers.sqlite3")
    counting = CountingLock()
    monkeypatch.setitem(base._locks, name, counting)
    opened = []

    def open_db() -> base.DatabaseWrapper:
        db = base.DatabaseWrapper({**connection.settings_dict, "ENGINE": "jobsite.sqlite3", "NAME": name,
                                   "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"}},
                                  alias=f"writers-{len(opened)}")
        db.ensure_connection()
        db.connection.execute("PRAGMA busy_timeout = 0")
        db.inc_thread_sharing()  # closed by the fixture, in the test's thread
        opened.append(db)
        return db

    first = open_db()
    with first.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("CREATE TABLE t (id integer PRIMARY KEY, v integer NOT NULL)")
        cursor.execute("INSERT INTO t VALUES (1, 0)")
    yield open_db, counting
    for db in opened:
        db.close()


def in_thread(work) -> tuple[threading.Thread, list]:
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(work())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def value(db) -> int:
    with db.cursor() as cursor:
        cursor.execute("SELECT v FROM t WHERE id = 1")
        return cursor.fetchone()[0]


@pytest.mark.parametrize("second", ["transaction", "autocommit write"])
def test_a_writer_waits_for_the_one_before_it_and_goes_when_it_commits(sqlite_file, second):
    """As Django's ``atomic`` and a write outside it drive the connection (BEGIN, statements, COMMIT)."""
    open_db, lock = sqlite_file
    first = open_db()

    def write() -> int:
        other = open_db()
        with other.cursor() as cursor:
            if second == "transaction":
                other._start_transaction_under_autocommit()
                cursor.execute("UPDATE t SET v = v + 10 WHERE id = 1")
                other._commit()
            else:
                cursor.execute("UPDATE t SET v = v + 10 WHERE id = 1")
        return value(other)

    first._start_transaction_under_autocommit()
    with first.cursor() as cursor:
        cursor.execute("UPDATE t SET v = v + 1 WHERE id = 1")
    thread, outcome = in_thread(write)
    wait_for(lambda: lock.waiting == 1 or outcome, timeout=60, message="the second writer to wait for the first")
    assert not outcome  # still waiting: SQLite's lock was never met (it would have failed at once)
    first._commit()
    thread.join(60)
    assert outcome == [11]
    assert not lock.locked()


def test_readers_never_wait_for_a_writer(sqlite_file):
    open_db, lock = sqlite_file
    writer, reader = open_db(), open_db()
    writer._start_transaction_under_autocommit()
    with writer.cursor() as cursor:
        cursor.execute("UPDATE t SET v = 5 WHERE id = 1")
    assert value(reader) == 0  # the last committed state, read while the write is under way
    assert lock.waiting == 0
    writer._rollback()
    assert not lock.locked()


@pytest.mark.parametrize("end", ["commit", "rollback", "close"])
def test_a_transaction_gives_the_lock_back_however_it_ends(sqlite_file, end):
    open_db, lock = sqlite_file
    db = open_db()
    db._start_transaction_under_autocommit()
    assert lock.locked()
    {"commit": db._commit, "rollback": db._rollback, "close": db._close}[end]()
    assert not lock.locked()


def test_a_begin_that_fails_gives_the_lock_back(sqlite_file):
    open_db, lock = sqlite_file
    holder, db = open_db(), open_db()
    with holder.cursor() as cursor:  # another process's writer, as far as the lock knows: SQLite's lock is held
        cursor.execute("BEGIN IMMEDIATE")
    with pytest.raises(Exception, match="locked"):
        db._start_transaction_under_autocommit()
    assert not lock.locked()
    holder.connection.rollback()


def test_a_statement_is_converted_to_sqlites_placeholders_once_per_text(sqlite_file, monkeypatch):
    """The text with ``?`` placeholders is kept: the second execution of a statement reuses it (so the regular
    expression over a long SELECT runs once), and what runs is what Django's conversion gives ("%%" a literal %)."""
    monkeypatch.setattr(base, "_converted", {})
    open_db, _ = sqlite_file
    db = open_db()
    query = "SELECT v FROM t WHERE id = %s AND 'a%%' LIKE 'a%%'"
    with db.cursor() as cursor:
        for expected in (0, 0):
            cursor.execute(query, [1])
            assert cursor.fetchone() == (expected,)
    assert base._converted == {query: "SELECT v FROM t WHERE id = ? AND 'a%' LIKE 'a%'"}
    kept = base._converted[query]
    with db.cursor() as cursor:
        cursor.execute(query, [2])
        assert cursor.fetchone() is None
    assert base._converted[query] is kept


def test_the_kept_texts_are_bounded(sqlite_file, monkeypatch):
    monkeypatch.setattr(base, "_converted", {})
    monkeypatch.setattr(base, "_CONVERTED_MAX", 3)
    open_db, _ = sqlite_file
    db = open_db()
    with db.cursor() as cursor:
        for n in range(7):
            cursor.execute(f"SELECT v + {n} FROM t WHERE id = %s", [1])
            assert cursor.fetchone() == (n,)
    assert 1 <= len(base._converted) <= 3
