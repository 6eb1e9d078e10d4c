"""What a web process does once, before its first request: the ASGI lifespan's startup (``jobsite.asgi``; uvicorn
sends it to each of ``jobsite.serve_web``'s processes) and the embedded server's start (``manage.py serve``).

- Every view, serializer and template tag module is imported now (the URL patterns resolved), not by the first
  requests.
- The objects the process holds from then on (modules, classes, settings, URL patterns: about 110,000) are moved
  out of the cyclic collector's reach (``gc.freeze``): a full collection walked them all each time. Measured on a
  web process under 50 back-to-back submitters: full collections of 100–216 ms (wall, the process's requests all
  waiting), about one every 1.5 s; the requests in hand at that moment made most of a submit's p95.
- The youngest generation is collected every ``GC_THRESHOLD[0]`` allocations instead of 700: a request allocates a
  few thousand objects, most freed by their count alone, so the collector ran several times a request for little.
"""

from __future__ import annotations

import gc

GC_THRESHOLD = (5000, 10, 10)


def prepare() -> None:
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018  (resolving them imports every view)
    gc.collect()  # what is garbage now is not frozen with the rest
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


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
