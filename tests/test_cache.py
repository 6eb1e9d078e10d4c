"""The production cache (jobsite.cache) against the real Redis: requests served in their own contexts, as under ASGI,
share the process's connections instead of each opening one."""

from __future__ import annotations

import asyncio

import pytest
import redis
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core.cache import CacheHandler

pytestmark = [pytest.mark.slow]

BACKENDS = ["django.core.cache.backends.redis.RedisCache", "jobsite.cache.SharedRedisCache"]


def connections_opened(url: str, backend: str, requests: int) -> int:
    """Connections Redis accepted while ``requests`` request contexts each read and write the cache once."""
    handler = CacheHandler({"default": {"BACKEND": backend, "LOCATION": url, "KEY_PREFIX": "jobsite-test-cache"}})

    def serve(n: int) -> object:
        cache = handler["default"]  # what django.core.cache.cache gives a request in its context
        cache.set(f"k{n}", n, 30)
        return cache.get(f"k{n}")

    async def one(n: int) -> object:
        async with ThreadSensitiveContext():  # Django's ASGI handler serves each request in its own
            return await sync_to_async(serve)(n)

    async def all_of_them() -> list[object]:  # a task per request, as the server makes, one after another
        return [await asyncio.create_task(one(n)) for n in range(requests)]

    admin = redis.Redis.from_url(url)
    before = admin.info("stats")["total_connections_received"]
    assert asyncio.run(all_of_them()) == list(range(requests))
    return admin.info("stats")["total_connections_received"] - before


def test_django_s_own_redis_cache_opens_a_connection_per_request_context():
    """The finding: what the shared client is for (if Django changes this, the shared one can go)."""
    assert connections_opened(settings.REDIS_URL, BACKENDS[0], 20) >= 20


def test_request_contexts_share_the_process_s_redis_connections():
    assert connections_opened(settings.REDIS_URL, BACKENDS[1], 20) <= 2


@pytest.mark.parametrize(("backend", "one_client"), [(BACKENDS[0], False), (BACKENDS[1], True)])
def test_the_shared_cache_builds_its_redis_client_once(backend, one_client):
    handler = CacheHandler({"default": {"BACKEND": backend, "LOCATION": settings.REDIS_URL,
                                        "KEY_PREFIX": "jobsite-test-cache"}})
    cache = handler["default"]
    cache.set("k", 1, 30)
    assert cache.get("k") == 1
    assert (cache._cache.get_client() is cache._cache.get_client(write=True)) is one_client
