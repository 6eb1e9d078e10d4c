"""Production scheduler process: leader election, admission passes, backend sync and housekeeping."""

import signal
import threading

from django.core.management.base import BaseCommand

from jobsite import process_memory
from scheduler.http import start_from_settings
from scheduler.loop import SchedulerLoop


class Command(BaseCommand):
    help = ("Run the scheduler in the foreground (one leader among the scheduler processes runs passes, sync and "
            "housekeeping); serve /healthz, /readyz and /metrics on JOBSITE_SCHEDULER_HTTP_PORT.")

    def add_arguments(self, parser):
        parser.add_argument("--interval", type=float, default=None)

    def handle(self, *args, interval, **options):
        loop = SchedulerLoop(interval=interval)
        # What the process holds from now on (modules, settings) out of the cyclic collector's reach, its youngest
        # generation collected less often: a pass deciding afresh allocates hundreds of thousands of objects.
        process_memory.settle()
        done = threading.Event()

        def shutdown(*_):
            loop.stop()
            done.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, shutdown)
        server = start_from_settings()  # /healthz, /readyz, /metrics (None when the port is 0)
        loop.start()
        while not done.wait(1.0) and loop.is_alive():
            pass
        loop.stop()
        loop.join(timeout=30)
        if server is not None:
            server.shutdown()
