"""Hot queries compiled to SQL once: a queryset built with stand-in values, compiled on first use, then run again
with each call's values put in their places.

Building and compiling a queryset (the filter's lookups, the joins of ``select_related``, the columns, the ordering)
costs the scheduler and the web far more CPU than the database spends answering the hottest reads, the job a
transition locks above all. A ``Prepared`` query keeps Django's compiler of its first run and its SQL; each later
call copies that compiler, gives it the SQL with its own values, and lets Django's own iterable build the rows, so
what comes back is exactly what the queryset gives (model instances with their related objects, or value tuples).

A list of ids (an ``__in`` lookup) is a placeholder per id: its SQL is compiled once for each length asked for, up
to ``LIST_MAX`` ids (a longer list, or an empty one, is built every call). A value that the queryset does not pass
through as it is (a lookup that rewrites it) cannot be found among the compiled parameters: such a query is then
built and compiled on every call, as any other."""

from __future__ import annotations

import copy
import inspect
import itertools
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import Model, QuerySet
from django.db.transaction import TransactionManagementError

_STAND_INS = itertools.count(2_000_000_011, 7)  # integers no query of the project holds, inside a 32-bit column
_lock = threading.Lock()
LIST_MAX = 64  # the longest list of ids a query is compiled for (once per length)
# The most ids one statement names (``in_parts``): PostgreSQL takes at most 65,535 parameters a statement (a pass that
# changed 50,000 jobs at once published them as one batch).
IDS_A_STATEMENT = 5000
_UNSET = object()


@dataclass(frozen=True)
class _Compiled:
    template: QuerySet
    compiler: Any
    sql: str
    params: tuple
    # (position among the params, name of the value, its index when the value is a list, the type the compiler
    # wrapped it in: psycopg's Int4, say)
    places: tuple[tuple[int, str, int | None, type], ...]
    converters: _Converters


class _Converters:
    """The compiler's converters of the columns it reads (a datetime from SQLite's text, a JSON value), worked out
    once per connection instead of on every run (a call per column: a fifth of a transition's read)."""

    def __init__(self) -> None:
        self.by_connection: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def of(self, compiler: Any) -> Callable[[Any], dict]:
        def get_converters(expressions: Any) -> dict:
            found = self.by_connection.get(compiler.connection)
            if found is None:
                found = self.by_connection[compiler.connection] = type(compiler).get_converters(compiler, expressions)
            return found
        return get_converters


class Prepared:
    """``build(**values)`` returns the queryset; ``kinds`` says what each value is: ``int``, ``str``, ``datetime``,
    or ``list`` (of ints, for ``__in``)."""

    def __init__(self, build: Callable[..., QuerySet], **kinds: type):
        self.build = build
        self.names = tuple(inspect.signature(build).parameters)
        if set(self.names) != set(kinds) or any(kind not in (int, str, datetime, list) for kind in kinds.values()):
            raise TypeError(f"name each of {self.names} as int, str, datetime or list")
        self.kinds = kinds
        self.lists = tuple(name for name, kind in kinds.items() if kind is list)
        self._compiled: dict[tuple[int, ...], _Compiled | None] = {}  # by the lengths of the lists

    def all(self, **values: Any) -> list:
        """The queryset's rows for these values, as iterating it would give them."""
        queryset = self._queryset(values)
        return list(queryset)

    def get(self, **values: Any) -> Model:
        """The one row for these values: ``DoesNotExist`` when none, ``MultipleObjectsReturned`` when several."""
        rows = self.all(**values)
        if len(rows) == 1:
            return rows[0]
        model = self.build(**values).model
        if not rows:
            raise model.DoesNotExist(f"{model._meta.object_name} matching {values} does not exist.")
        raise model.MultipleObjectsReturned(f"{len(rows)} {model._meta.object_name} rows match {values}.")

    def _queryset(self, values: dict[str, Any]) -> QuerySet:
        if set(values) != set(self.names):
            raise TypeError(f"give exactly {self.names}")
        values = {**values, **{name: list(values[name]) for name in self.lists}}
        shape = tuple(len(values[name]) for name in self.lists)
        compiled = self._compiled.get(shape, _UNSET) if max(shape, default=0) <= LIST_MAX else None
        if compiled is _UNSET:
            with _lock:
                compiled = self._compiled.get(shape, _UNSET)
                if compiled is _UNSET:
                    compiled = self._compiled[shape] = self._compile(shape)
        if compiled is None:
            return self.build(**values)
        params = list(compiled.params)
        connection = connections[compiled.template.db]  # this thread's
        for position, name, index, wrap in compiled.places:
            value = _db_value(self.kinds[name], values[name] if index is None else values[name][index], connection)
            params[position] = value if type(value) is wrap else wrap(value)
        if (compiled.template.query.select_for_update and connection.features.has_select_for_update
                and connection.get_autocommit()):  # as Django's compiler refuses it
            raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
        compiler = copy.copy(compiled.compiler)
        compiler.connection = connection
        sql, bound = compiled.sql, tuple(params)
        compiler.as_sql = lambda *args, **kwargs: (sql, bound)
        compiler.get_converters = compiled.converters.of(compiler)
        queryset = compiled.template._chain()
        queryset.query.get_compiler = lambda *args, **kwargs: compiler
        return queryset

    def _compile(self, shape: tuple[int, ...] | None = None) -> _Compiled | None:
        """The query compiled for lists of these lengths (by default two ids each); None when it cannot be."""
        lengths = dict(zip(self.lists, shape or (2,) * len(self.lists), strict=True))
        stand_ins = {name: ([next(_STAND_INS) for _ in range(lengths[name])] if kind is list else _stand_in(kind, name))
                     for name, kind in self.kinds.items()}
        template = self.build(**stand_ins)
        compiler = template.query.get_compiler(using=template.db)
        try:
            sql, params = compiler.as_sql()
        except EmptyResultSet:  # an empty list: Django answers without asking the database
            return None
        wanted = {(name, index): _db_value(self.kinds[name], value, compiler.connection)
                  for name, stand_in in stand_ins.items()
                  for index, value in (enumerate(stand_in) if name in lengths else [(None, stand_in)])}
        places = tuple((position, name, index, type(param)) for position, param in enumerate(params)
                       for (name, index), stand_in in wanted.items()
                       if isinstance(param, type(stand_in)) and param == stand_in)
        if {(name, index) for _, name, index, _ in places} != set(wanted):
            return None  # a value the queryset rewrote: built on every call
        return _Compiled(template=template, compiler=compiler, sql=sql, params=tuple(params), places=places,
                         converters=_Converters())


def _stand_in(kind: type, name: str) -> Any:
    n = next(_STAND_INS)
    if kind is int:
        return n
    if kind is datetime:  # an instant no row holds: its microseconds tell it from any other stand-in
        return datetime(2001, 2, 3, 4, 5, 6, n % 1_000_000, tzinfo=UTC)
    return f"\x1eprepared:{name}:{n}\x1e"


def _db_value(kind: type, value: Any, connection) -> Any:
    """A value as the compiled query holds it: a datetime as the database's field takes it (SQLite: text)."""
    return connection.ops.adapt_datetimefield_value(value) if kind is datetime else value


def in_parts(ids: Iterable[int], read: Callable[[list[int]], Iterable[Any]]) -> list:
    """``read`` of ``ids`` in parts of at most IDS_A_STATEMENT ids, one after another, the rows together: for a read
    whose rows for some ids are its rows for each of them (a filter on them, not a limit or a total)."""
    ids = list(ids)
    return [row for start in range(0, len(ids), IDS_A_STATEMENT) for row in read(ids[start:start + IDS_A_STATEMENT])]
