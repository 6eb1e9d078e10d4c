"""Open job-list pages during a benchmark: WebSocket clients logged in as a user (a session cookie from the login
form), on an event loop in a thread of the benchmark's process, counting the frames they receive."""

from __future__ import annotations

import asyncio
import http.cookiejar
import re
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable


def session_cookie(base: str, username: str, password: str) -> str:
    """Log in through the login form, as a browser does; the session cookie's value."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{base}/login/", timeout=60).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    body = urllib.parse.urlencode({"username": username, "password": password, "csrfmiddlewaretoken": token}).encode()
    opener.open(urllib.request.Request(f"{base}/login/", data=body, headers={"Referer": f"{base}/login/"}),
                timeout=60).read()
    cookies = {c.name: c.value for c in jar}
    if "sessionid" not in cookies:
        raise RuntimeError(f"could not log in as {username}")
    return cookies["sessionid"]


class Watchers:
    """``count`` sockets on ``path`` (the job list: its group's changes are rendered and sent to them)."""

    def __init__(self, base: str, cookie: str, count: int, path: str = "/ws/jobs/") -> None:
        self.url = base.replace("http://", "ws://") + path
        self.origin, self.cookie, self.count = base, cookie, count
        self.frames = self.failed = 0
        self.connected = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.stopping: asyncio.Event | None = None
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._run(),), daemon=True)

    def __enter__(self) -> Watchers:
        self.thread.start()
        if not self.connected.wait(120) or self.failed:
            raise RuntimeError(f"{self.failed} of {self.count} page sockets could not connect")
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(30)

    async def _run(self) -> None:
        self.stopping = asyncio.Event()
        opened = 0

        def one_opened() -> None:
            nonlocal opened
            opened += 1
            if opened == self.count:
                self.connected.set()

        async def one() -> None:
            try:
                await page_socket(self.url, self.origin, self.cookie, self.stopping, one_opened, self._frame)
            except Exception:
                self.failed += 1
                self.connected.set()

        await asyncio.gather(*(one() for _ in range(self.count)))

    def _frame(self) -> None:
        self.frames += 1


async def page_socket(url: str, origin: str, cookie: str, stopping: asyncio.Event, opened: Callable[[], None],
                      frame: Callable[[], None]) -> None:
    """One page's socket, logged in with the session ``cookie``, until ``stopping`` is set: ``opened()`` once
    connected, ``frame()`` for each frame received. Raises if it cannot connect or is closed meanwhile."""
    import websockets

    async with websockets.connect(url, origin=origin, open_timeout=60, max_queue=None,
                                  additional_headers={"Cookie": f"sessionid={cookie}"}) as ws:
        opened()
        stop = asyncio.ensure_future(stopping.wait())
        while True:
            recv = asyncio.ensure_future(ws.recv())
            done, _ = await asyncio.wait({recv, stop}, return_when=asyncio.FIRST_COMPLETED)
            if stop in done:
                recv.cancel()
                return
            recv.result()
            frame()
