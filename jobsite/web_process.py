"""What a web process does once, before its first request: the ASGI lifespan's startup (``jobsite.asgi``; uvicorn
sends it to each of ``jobsite.serve_web``'s processes) and the embedded server's start (``manage.py serve``).

- Every view, serializer and template tag module is imported now (the URL patterns resolved), not by the first
  requests.
- Its memory is settled (``jobsite.process_memory.settle``): what it holds from then on (modules, classes,
  settings, URL patterns: about 110,000 objects) out of the cyclic collector's reach, the youngest generation
  collected less often. Measured on a web process under 50 back-to-back submitters: full collections of 100–216 ms
  (wall, the process's requests all waiting), about one every 1.5 s; the requests in hand at that moment made most
  of a submit's p95.
"""

from __future__ import annotations

from jobsite import process_memory


def prepare() -> None:
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018  (resolving them imports every view)
    process_memory.settle()


async def lifespan(scope, receive, send) -> None:
    """The ASGI lifespan protocol: ``prepare`` at startup; nothing to do at shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            prepare()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
