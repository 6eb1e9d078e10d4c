"""What a submit is checked against, kept in memory between submits: groups with their quotas, each user's groups,
images and instance types with the groups that may use them (``lookups()``).

A warm submit reads none of them from the database; instead it reads one shared version key from Django's cache
(Redis in production, so every web process reads the same key). Every change of those rows through the ORM (saved
or deleted, an m2m add/remove/clear, a cascade, a flush or migration) gives the key a new value once it commits
(``lookups_changed``, connected by ``connect_signals``), and a process whose copy was read under another value
drops it all and reads again. An admin who removes a membership or takes an image from a group therefore refuses
the next submit of every process. What is read is never kept when it was read inside a transaction (it may hold
uncommitted rows that are later rolled back), and nothing is kept longer than ``MAX_AGE`` seconds: the backstop
for a change that no signal reports (``QuerySet.update``, raw SQL) or a cache that is not shared between
processes (the embedded default's local memory, changed from another process such as a shell).

If the cache cannot be read, nothing is kept and every lookup reads the database.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Value
from django.db.models.signals import m2m_changed, post_delete, post_migrate, post_save

from ..models import Group, GroupQuota, Image, InstanceType, Membership

log = logging.getLogger(__name__)

VERSION_KEY = "jobs:submit-lookups:version"
MAX_AGE = 10.0  # seconds anything is kept, whatever the version key says
MAX_ENTRIES = 50_000  # past it everything kept is dropped and read again as needed


_MISSING = object()


@dataclass
class _Kept:
    """What one process keeps under one value of the version key: objects by name (None: there is none) and
    yes/no answers by ids (is the user a member of the group, may the group use the image or instance type)."""

    version: str
    at: float
    entries: dict[tuple, object] = field(default_factory=dict)


_kept: _Kept | None = None
_lock = threading.Lock()


def _allowed_in(model, group_id: int | None):
    """``allowed``: whether the group may use the image or instance type (never without a group)."""
    if group_id is None:
        return Value(False)
    column = f"{model._meta.model_name}_id"
    return Exists(model.groups.through.objects.filter(**{column: OuterRef("pk")}, group_id=group_id))


def _current_version() -> str | None:
    """The shared version key's value (a new one when it is missing), or None when the cache cannot be read."""
    try:
        version = cache.get(VERSION_KEY)
        if version is None:
            cache.add(VERSION_KEY, uuid.uuid4().hex, timeout=None)
            version = cache.get(VERSION_KEY)
    except Exception:  # noqa: BLE001 - an unreachable cache means reading the database, never failing a submit
        log.warning("submit lookups: the cache cannot be read; reading the database", exc_info=True)
        return None
    return version


class Lookups:
    """One submit's view of the lookups: what is kept when it may be used, else read (and kept when it may be;
    else only for this submit)."""

    def __init__(self) -> None:
        global _kept
        self._entries: dict[tuple, object] = {}
        if connection.in_atomic_block:
            return  # a transaction may see its own uncommitted rows: read, never keep nor use what is kept
        version = _current_version()
        if version is None:
            return
        now = time.monotonic()
        kept = _kept
        if kept is None or kept.version != version or now - kept.at > MAX_AGE:
            with _lock:
                kept = _kept
                if kept is None or kept.version != version or now - kept.at > MAX_AGE:
                    kept = _kept = _Kept(version=version, at=now)
        self._entries = kept.entries

    def _get(self, key: tuple):
        return self._entries.get(key, _MISSING)

    def _put(self, key: tuple, value) -> None:
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()
        self._entries[key] = value

    def group(self, name: str, user_id: int) -> tuple[Group | None, bool]:
        """The group called ``name`` (a copy of its own; None if there is none) and whether the user is a member:
        one query when neither is kept."""
        group = self._get(("group", name))
        if group is _MISSING:
            group = (Group.objects.filter(name=name)
                     .annotate(member=Exists(Membership.objects.filter(group=OuterRef("pk"), user_id=user_id)))
                     .first())
            if group is not None:
                self._put(("member", user_id, group.pk), group.__dict__.pop("member"))
            self._put(("group", name), group)
        if group is None:
            return None, False
        member = self._get(("member", user_id, group.pk))
        if member is _MISSING:
            member = Membership.objects.filter(group_id=group.pk, user_id=user_id).exists()
            self._put(("member", user_id, group.pk), member)
        return copy.copy(group), member

    def quotas(self, group_id: int) -> tuple[GroupQuota, ...]:
        quotas = self._get(("quotas", group_id))
        if quotas is _MISSING:
            quotas = tuple(GroupQuota.objects.filter(group_id=group_id).order_by("resource"))
            self._put(("quotas", group_id), quotas)
        return quotas

    def _allowed(self, model, name: str, group_id: int | None):
        """The image or instance type called ``name`` (a copy; None if there is none) and whether the group may use
        it: one query when neither is kept."""
        kind = model._meta.model_name
        obj = self._get((kind, name))
        if obj is _MISSING:
            obj = model.objects.filter(name=name).annotate(allowed=_allowed_in(model, group_id)).first()
            if obj is not None:
                allowed = obj.__dict__.pop("allowed")
                if group_id is not None:
                    self._put((kind, "allowed", obj.pk, group_id), allowed)
            self._put((kind, name), obj)
        if obj is None:
            return None, False
        if group_id is None:
            return copy.copy(obj), False
        allowed = self._get((kind, "allowed", obj.pk, group_id))
        if allowed is _MISSING:
            column = f"{kind}_id"
            allowed = model.groups.through.objects.filter(**{column: obj.pk}, group_id=group_id).exists()
            self._put((kind, "allowed", obj.pk, group_id), allowed)
        return copy.copy(obj), allowed

    def image(self, name: str, group_id: int | None) -> tuple[Image | None, bool]:
        return self._allowed(Image, name, group_id)

    def instance_type(self, name: str, group_id: int | None) -> tuple[InstanceType | None, bool]:
        return self._allowed(InstanceType, name, group_id)


def lookups() -> Lookups:
    return Lookups()


def _bump() -> None:
    global _kept
    _kept = None  # this process at once, whatever the cache does
    try:
        cache.set(VERSION_KEY, uuid.uuid4().hex, timeout=None)
    except Exception:  # noqa: BLE001
        log.warning("submit lookups: the version key could not be changed; other processes see the change "
                    "within %s s", MAX_AGE, exc_info=True)


def lookups_changed(*, action: str = "post_", **_: object) -> None:
    """A signal receiver: what a submit is checked against changed. The shared version changes after the commit
    (at once in autocommit); until then this process drops its kept copy, and a transaction's own reads never use
    one (``Lookups``). Of an m2m change (``action``) only what follows it counts."""
    global _kept
    if not action.startswith("post_"):
        return
    _kept = None
    transaction.on_commit(_bump, robust=True)


WATCHED = (Group, Membership, GroupQuota, Image, InstanceType, Image.groups.through, InstanceType.groups.through)


def connect_signals() -> None:
    for model in WATCHED:
        uid = f"jobs.submit_lookups.{model._meta.label_lower}"
        post_save.connect(lookups_changed, sender=model, dispatch_uid=f"{uid}.save")
        post_delete.connect(lookups_changed, sender=model, dispatch_uid=f"{uid}.delete")
    for through in (Image.groups.through, InstanceType.groups.through, Membership):
        m2m_changed.connect(lookups_changed, sender=through, dispatch_uid=f"jobs.submit_lookups.m2m.{through}")
    post_migrate.connect(lookups_changed, dispatch_uid="jobs.submit_lookups.migrate")
