"""Hot writes whose SQL is made once: an UPDATE of some columns of one row (of an instance in hand, or by its key
and only while some columns are still empty), and an INSERT of a whole row.

Django's ``save`` and ``create`` build a query and compile it to SQL on every call (a query object, its compiler,
each column quoted): on the hottest writes, a transition's job row and its event, that costs the scheduler and the
web more CPU than the database spends on them. These make a statement's SQL once per model, database and columns,
and pass each value as Django's own field prepares it (``pre_save``, so ``auto_now`` and ``auto_now_add`` apply,
then ``get_db_prep_save``). A model whose saves something listens to (``pre_save``, ``post_save``), a field that
needs a placeholder of its own, or a value that is an expression, goes through Django's ``save`` as before."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import DatabaseError, connections, router
from django.db.models import Model
from django.db.models.signals import post_save, pre_save

_sql: dict[tuple, str] = {}


def _special(fields, values) -> bool:
    """A field that needs a placeholder of its own, or a value that is an expression: left to Django."""
    return any(hasattr(f, "get_placeholder") or hasattr(v, "resolve_expression")
               for f, v in zip(fields, values, strict=True))


def plain(fields, model: type[Model]) -> bool:
    """Django's ``save`` writes these ``fields`` of ``model`` plainly: nothing listens to the model's saves and no
    field needs a placeholder of its own (its values may still be expressions: ``_special``)."""
    return not (pre_save.has_listeners(model) or post_save.has_listeners(model)
                or any(hasattr(f, "get_placeholder") for f in fields))


def _plain(fields, instance: Model) -> bool:
    return plain(fields, type(instance)) and not _special(fields, [getattr(instance, f.attname) for f in fields])


def update_fields(instance: Model, names: Sequence[str], *, using: str | None = None) -> None:
    """As ``instance.save(update_fields=names)`` for a row that exists: one ``UPDATE … WHERE pk = …``; a row gone
    raises ``DatabaseError`` as Django's does."""
    model = type(instance)
    meta = model._meta
    fields = [meta.get_field(name) for name in names]
    if not fields or not _plain(fields, instance):
        instance.save(update_fields=names, using=using)
        return
    db = using or router.db_for_write(model, instance=instance)
    connection = connections[db]
    key = ("update", model, db, tuple(names))
    sql = _sql.get(key)
    if sql is None:
        qn = connection.ops.quote_name
        sql = _sql[key] = (f"UPDATE {qn(meta.db_table)} SET {', '.join(f'{qn(f.column)} = %s' for f in fields)} "
                           f"WHERE {qn(meta.pk.column)} = %s")
    params = [f.get_db_prep_save(f.pre_save(instance, False), connection) for f in fields]
    params.append(meta.pk.get_db_prep_value(instance.pk, connection))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if cursor.rowcount != 1:
            raise DatabaseError(f"{meta.object_name} {instance.pk}: the update of {', '.join(names)} changed "
                                f"{cursor.rowcount} rows")
    instance._state.db = db


def update_row(model: type[Model], pk: Any, values: Mapping[str, Any], *, where_null: Sequence[str] = (),
               using: str | None = None) -> int:
    """As ``model.objects.filter(pk=pk, <name>__isnull=True for each of where_null).update(**values)``: the
    number of rows changed (0 when the row is gone or one of ``where_null`` is set). No ``pre_save`` applies (as
    ``update``); a value that is an expression, or a field with a placeholder of its own, goes through Django."""
    meta = model._meta
    fields = [meta.get_field(name) for name in values]
    if not fields or _special(fields, values.values()):
        return model._default_manager.using(using).filter(
            pk=pk, **{f"{name}__isnull": True for name in where_null}).update(**values)
    db = using or router.db_for_write(model)
    connection = connections[db]
    key = ("update_row", model, db, tuple(values), tuple(where_null))
    sql = _sql.get(key)
    if sql is None:
        qn = connection.ops.quote_name
        empty = "".join(f" AND {qn(meta.get_field(name).column)} IS NULL" for name in where_null)
        sql = _sql[key] = (f"UPDATE {qn(meta.db_table)} SET {', '.join(f'{qn(f.column)} = %s' for f in fields)} "
                           f"WHERE {qn(meta.pk.column)} = %s{empty}")
    params = [f.get_db_prep_save(v, connection) for f, v in zip(fields, values.values(), strict=True)]
    params.append(meta.pk.get_db_prep_value(pk, connection))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def inserted_fields(model: type[Model]) -> list:
    """The fields an insert of a ``model`` row writes: all of its own columns but the key and generated ones."""
    return [f for f in model._meta.local_concrete_fields if not f.primary_key and not f.generated]


def insert(instance: Model, *, using: str | None = None) -> Model:
    """As ``Model.objects.create``: the row inserted, its new primary key read back in the same statement."""
    model = type(instance)
    meta = model._meta
    fields = inserted_fields(model)
    db = using or router.db_for_write(model, instance=instance)
    connection = connections[db]
    if (instance.pk is not None or meta.pk not in meta.local_concrete_fields or meta.parents
            or not connection.features.can_return_columns_from_insert or not _plain(fields, instance)):
        instance.save(force_insert=True, using=using)
        return instance
    key = ("insert", model, db)
    sql = _sql.get(key)
    if sql is None:
        qn = connection.ops.quote_name
        returning, _ = connection.ops.return_insert_columns([meta.pk])
        sql = _sql[key] = (f"INSERT INTO {qn(meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
                           f"VALUES ({', '.join(['%s'] * len(fields))}) {returning}")
    params = [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    pk = row[0]
    for converter in meta.pk.get_db_converters(connection):
        pk = converter(pk, meta.pk, connection)
    instance.pk = pk
    instance._state.adding, instance._state.db = False, db
    return instance
