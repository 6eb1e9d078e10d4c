"""A long-lived process settles its memory once, before its work (``jobsite.process_memory``): what it holds frozen
out of the cyclic collector's reach, the youngest generation collected less often.

- A web process does it at the ASGI lifespan's startup (``jobsite.web_process``), after importing every view.
  Measured before: full collections of 100–216 ms under load, the process's requests waiting.
- The scheduler process (``manage.py runscheduler``) does it before its loop starts. Measured before: a pass deciding
  afresh on the realistic mix took 174 ms of CPU with the interpreter's defaults, 109 ms settled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from jobsite.process_memory import GC_THRESHOLD

ROOT = Path(__file__).resolve().parents[1]

# A process as uvicorn runs the app: the lifespan's startup and shutdown, then what the process looks like.
WEB_PROCESS = textwrap.dedent("""
    import asyncio, gc, json, sys
    from jobsite.asgi import application
    before = {"frozen": gc.get_freeze_count(), "views": "jobs.views" in sys.modules}
    sent = []

    async def run():
        messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
        async def receive():
            return messages.pop(0)
        async def send(message):
            sent.append(message["type"])
        await application({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)

    asyncio.run(run())
    print(json.dumps({"before": before, "sent": sent, "frozen": gc.get_freeze_count(),
                      "threshold": gc.get_threshold(), "views": "jobs.views" in sys.modules}))
""")

# ``manage.py runscheduler`` as it is when its loop would start: the loop's start reads the collector's state and
# ends the command.
SCHEDULER_PROCESS = textwrap.dedent("""
    import gc, json
    import django
    django.setup()
    from django.core.management import call_command
    from scheduler.management.commands import runscheduler

    seen = {"before": gc.get_freeze_count()}

    class Probe(runscheduler.SchedulerLoop):
        def start(self):
            seen.update(frozen=gc.get_freeze_count(), threshold=gc.get_threshold())
            raise SystemExit(0)

    runscheduler.SchedulerLoop = Probe
    try:
        call_command("runscheduler")
    except SystemExit:
        pass
    print(json.dumps(seen))
""")


def _seen(script: str, **env: str) -> dict:
    """What ``script``, run in a fresh interpreter of the project, printed last (JSON)."""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "DJANGO_SETTINGS_MODULE": "jobsite.settings", **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_web_process_at_startup_imports_its_views_and_freezes_what_it_holds():
    seen = _seen(WEB_PROCESS)
    assert seen["before"] == {"frozen": 0, "views": False}
    assert seen["sent"] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert seen["views"] and seen["frozen"] > 50_000
    assert tuple(seen["threshold"]) == GC_THRESHOLD


def test_the_scheduler_process_freezes_what_it_holds_before_it_schedules():
    seen = _seen(SCHEDULER_PROCESS, JOBSITE_SCHEDULER_HTTP_PORT="0")
    assert seen["before"] == 0
    assert seen["frozen"] > 50_000
    assert tuple(seen["threshold"]) == GC_THRESHOLD
