"""The cache backend of production: Django's Redis cache, with one Redis client (its connection pool) per process.

Django keeps a cache object per request context under ASGI (``django.core.cache.caches`` is context-local), and
Django's Redis cache builds its client, with a fresh connection pool, per cache object: every request opened a new
connection to Redis (TCP, then AUTH and SELECT) for its first cache read, and dropped it after. Here the cache
objects of one process with the same servers and options share one client, so requests reuse the pool's connections
(redis-py's pools are thread-safe). Django's client also builds a ``redis.Redis`` around its pool for every command
(a third of a cache read's CPU: its response callbacks, a case-insensitive dict, set up each time); the shared
client keeps one per pool, as thread-safe as the pool it wraps."""

from __future__ import annotations

import threading

from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from django.utils.functional import cached_property

_clients: dict[tuple, RedisCacheClient] = {}
_lock = threading.Lock()


class _OneRedisPerPool(RedisCacheClient):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._made: dict[int, object] = {}  # pool index → its redis.Redis

    def get_client(self, key=None, *, write=False):
        index = self._get_connection_pool_index(write)
        client = self._made.get(index)
        if client is None:
            with _lock:
                client = self._made.get(index)
                if client is None:
                    client = self._made[index] = self._client(connection_pool=self._get_connection_pool(write))
        return client


class SharedRedisCache(RedisCache):
    @cached_property
    def _cache(self) -> RedisCacheClient:
        key = (tuple(self._servers), repr(sorted(self._options.items())))
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = _OneRedisPerPool(self._servers, **self._options)
        return client
