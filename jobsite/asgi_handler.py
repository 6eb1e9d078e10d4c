"""Django's ASGI handler with its middleware run in one thread hop.

Under ASGI Django builds its middleware chain for the event loop: the site's sync middleware run in a thread, which
hands the rest back to the loop (for django-htmx's, which can run async, and to call the view), which hands the
view to the thread again. When the process is busy (the embedded default runs the scheduler in it) each hand-over
waits for the loop and the GIL: profiled, the web thread spent about half of a submit's time waiting there. Here
the chain is built as under WSGI (each middleware and the view called directly, one after another) and the loop
hands the whole of it to the thread Django would use (``thread_sensitive``) once. A middleware that can only run
async would still work: Django adapts it, with a hand-over of its own."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler


class OneHopASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)
        self._middleware_chain = sync_to_async(self._middleware_chain, thread_sensitive=True)
