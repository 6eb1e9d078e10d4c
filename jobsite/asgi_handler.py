"""Django's ASGI handler with all of a request's synchronous work done in one hop to a thread of a kept pool.

Django's own handler, for each request: starts a thread of its own (``ThreadSensitiveContext``) and joins it at the
end, from the event loop; hands the ``request_started`` signal, the middleware (the site's sync middleware run in a
thread, which hands the rest back to the loop for django-htmx's, which can run async, and to call the view, which
goes to the thread again) and the response's ``close`` (``request_finished``) to that thread one after another, each
hand-over waiting for the loop and the GIL; and a new thread opens a new database connection (SQLite: a file, its
pragmas). Profiled on the embedded default, half of a submit's time in the web went to those hand-overs.

Here the event loop reads the body, then hands the rest to a thread of a pool kept for the process
(JOBSITE_WEB_THREADS, as a WSGI server's threads): ``request_started``, the request, the middleware chain built as
under WSGI (each middleware and the view called directly) and, for a response whose content is in hand, its
``close`` (``request_finished``: the thread's database connection is given back before a byte is sent). The loop
sends it; a streamed response (a log download: its body is read by the loop) is closed in a second hop once sent.
A client that goes away stops the sending; the view itself, synchronous, always runs to its end, as under Django's
handler. A middleware that can only run async would still work: Django adapts it, with a hand-over of its own.
A request counts towards its process's share of the port's connections (``jobsite.accept_gate``) from the body's
read to the end of its thread's work."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from concurrent.futures import ThreadPoolExecutor
from functools import cache

from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import FileResponse
from django.urls import set_script_prefix

from jobsite import accept_gate


@cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=settings.JOBSITE_WEB_THREADS, thread_name_prefix="jobsite-web")


async def _in_thread(func, *args):
    """``func(*args)`` in a thread of the pool, in a copy of this task's context (as ``asyncio.to_thread``)."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_pool(), context.run, func, *args)


async def _gone(receive) -> None:
    """Returns when the client goes away: after the body, the only message the server sends."""
    await receive()


class OneHopASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        await self.handle(scope, receive, send)

    async def handle(self, scope, receive, send) -> None:
        made = await self._made(scope, receive)
        if made is None:
            return
        body_file, response, closed = made
        gone = asyncio.ensure_future(_gone(receive))
        try:
            try:
                if not gone.done():
                    sending = asyncio.ensure_future(self.send_response(response, send))
                    await asyncio.wait([sending, gone], return_when=asyncio.FIRST_COMPLETED)
                    if not sending.done():  # the client went away: nothing more to send it
                        sending.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sending
            finally:
                if not closed:
                    await _in_thread(response.close)
        finally:
            gone.cancel()
            body_file.close()

    async def _made(self, scope, receive):
        """The body read and the response made (and whether it is closed already), or None when the client went
        away first: the work a request counts for in its process's share of the port (``accept_gate``)."""
        with accept_gate.in_hand():
            try:
                body_file = await self.read_body(receive)
            except RequestAborted:
                return None
            try:
                return body_file, *await _in_thread(self._respond, scope, body_file)
            except BaseException:
                body_file.close()
                raise

    def _respond(self, scope, body_file):
        """In a thread of the pool: the response, and whether it is closed already (its content in hand)."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.get_response(request)
            response._handler_class = self.__class__
            if isinstance(response, FileResponse):  # the server does the chunking
                response.block_size = self.chunk_size
        if response.streaming:
            return response, False
        response.close()
        return response, True
