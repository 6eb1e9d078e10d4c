"""Django's SQLite backend, whose writers take a lock of the process before SQLite's write lock.

The embedded default runs the web server and the scheduler in one process, each thread with its own connection to
one file; every transaction begins IMMEDIATE (it takes SQLite's write lock at once) and a write outside one takes it
for its statement. A writer that finds the file locked is made to wait by SQLite's busy handler, which sleeps and
tries again (1, 2, 5, 10 ms and longer): a submit arriving while the scheduler wrote slept past the scheduler's
commit. Here the threads of the process queue on a lock of their own, held from BEGIN to COMMIT or ROLLBACK (or for
one statement that writes outside a transaction), and the next goes as soon as the last is done. Another process on
the same file (a management command) still meets SQLite's own lock and its busy timeout.

A statement's SQL is turned from Django's ``%s`` placeholders into SQLite's ``?`` once per text, not at every
execution (Django's backend runs a regular expression over the whole text each time: a job's row, 70 columns, cost
50 us of the 480 a locking read of it takes)."""

from __future__ import annotations

import threading
from contextlib import nullcontext

from django.db.backends.sqlite3 import base

_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()
_READS = ("SELECT", "PRAGMA", "EXPLAIN")
# The statements' texts with SQLite's placeholders, by Django's text: the queries an installation runs are a few
# hundred texts, run again and again. Bounded all the same (texts with many ``IN`` values vary by their count).
_CONVERTED_MAX = 4096
_converted: dict[str, str] = {}


def _writer_lock(name: str) -> threading.Lock:
    with _locks_lock:
        return _locks.setdefault(name, threading.Lock())


class DatabaseWrapper(base.DatabaseWrapper):
    _writer: threading.Lock | None = None  # held by this connection: from BEGIN to its end

    def _acquire_writer(self) -> threading.Lock | None:
        lock = _writer_lock(str(self.settings_dict["NAME"]))
        # As long as SQLite's busy timeout: past it, the statement meets SQLite's lock and fails as it would have.
        return lock if lock.acquire(timeout=float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5))) else None

    def _start_transaction_under_autocommit(self) -> None:
        self._writer = self._acquire_writer()
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._release_writer()
            raise

    def _release_writer(self) -> None:
        lock, self._writer = self._writer, None
        if lock is not None:
            lock.release()

    def statement_writer(self, query: str):
        """What a statement holds while it runs: the lock, for a write outside a transaction of this connection."""
        if self._writer is not None or self.connection.in_transaction or query.lstrip()[:7].upper().startswith(_READS):
            return nullcontext()
        return _Held(self)

    def create_cursor(self, name=None):
        cursor = self.connection.cursor(factory=_Cursor)
        cursor.wrapper = self
        return cursor

    def _commit(self):
        try:
            return super()._commit()
        finally:
            self._release_writer()

    def _rollback(self):
        try:
            return super()._rollback()
        finally:
            self._release_writer()

    def _close(self):
        try:
            return super()._close()
        finally:
            self._release_writer()


class _Held:
    def __init__(self, wrapper: DatabaseWrapper):
        self.wrapper = wrapper

    def __enter__(self) -> None:
        self.lock = self.wrapper._acquire_writer()

    def __exit__(self, *exc) -> None:
        if self.lock is not None:
            self.lock.release()


class _Cursor(base.SQLiteCursorWrapper):
    wrapper: DatabaseWrapper

    def execute(self, query, params=None):
        with self.wrapper.statement_writer(query):
            return super().execute(query, params)

    def executemany(self, query, param_list):
        with self.wrapper.statement_writer(query):
            return super().executemany(query, param_list)

    def convert_query(self, query, *, param_names=None):
        if param_names is not None:  # pyformat (named) parameters: rare, as Django's
            return super().convert_query(query, param_names=param_names)
        converted = _converted.get(query)
        if converted is None:
            if len(_converted) >= _CONVERTED_MAX:
                _converted.clear()
            converted = _converted[query] = super().convert_query(query)
        return converted
