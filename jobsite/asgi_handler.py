"""Django's ASGI handler with its middleware run in one thread hop.

Django's own handler builds an async middleware chain under ASGI: a chain of sync middleware (every middleware of
this site is sync) is run in a thread, which hands the view's call back to the event loop, which hands it to the
thread again. When the process is busy (the embedded default runs the scheduler in it) each hand-over waits for
the loop and the GIL: about half of a submit's time in the web thread was spent waiting there. Here the chain is
built as under WSGI (the middleware and the view called directly, one after another, in the thread) and the loop
calls the whole chain once, in the thread Django would use (``thread_sensitive``)."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler


class OneHopASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)
        self._middleware_chain = sync_to_async(self._middleware_chain, thread_sensitive=True)
