"""Who listens now: the channel-layer groups some web process has joined, asked before a change is read, rendered
and sent, so that a change no page shows costs one small question and nothing else.

On the Redis pub/sub layer (production) a group is a Redis channel, ``<prefix>__group__<name>``, which a web
process's hub (``jobs.live_hub``) subscribes to while one of its sockets needs it. ``PUBSUB CHANNELS`` on each of
the layer's hosts lists the channels that have a subscriber, one round trip each. Publishing to a group nobody
subscribes to reaches no one, so leaving it out loses nothing, even when a hub subscribes just after the question:
its sockets read the database once subscribed (a socket's first catch-up, ``jobs.catchup``), and the change was
committed before the question was asked. A "nobody" is never kept: it is asked again for the next batch.

Any other layer (the in-memory one of the embedded default, a test's): unknown, so every audience is sent to.
"""

from __future__ import annotations

from typing import Any

from channels_redis.pubsub import RedisPubSubChannelLayer
from channels_redis.utils import create_pool, decode_hosts
from redis import asyncio as aioredis


class Audience:
    """Asked on one event loop (the publisher's): ``await groups()``."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.clients: list[aioredis.Redis] | None = None
        self.prefix = ""

    async def groups(self) -> set[str] | None:
        """The layer groups with a subscriber now; None when the layer cannot tell (send to every audience).
        Raises when Redis cannot be reached (as a send would)."""
        if not isinstance(self.layer, RedisPubSubChannelLayer):
            return None
        if self.clients is None:
            config = self.layer._kwargs  # the layer's CONFIG, as it was made from
            self.prefix = f"{config.get('prefix', 'asgi')}__group__"  # the layer's name for a group's channel
            self.clients = [aioredis.Redis(connection_pool=create_pool(host))
                            for host in decode_hosts(config.get("hosts"))]
        found: set[str] = set()
        pattern = _glob_escaped(self.prefix) + "*"
        for client in self.clients:
            for channel in await client.pubsub_channels(pattern):
                name = channel.decode() if isinstance(channel, bytes) else channel
                found.add(name[len(self.prefix):])
        return found

    async def close(self) -> None:
        for client in self.clients or ():
            try:
                await client.aclose(close_connection_pool=True)
            except Exception:  # already gone with its Redis: nothing to release
                pass
        self.clients = None


def _glob_escaped(text: str) -> str:
    """``text`` matched literally by a Redis glob pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
