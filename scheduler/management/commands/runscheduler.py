"""Production scheduler process: admission passes, backend sync and housekeeping in a loop."""

import signal

from django.core.management.base import BaseCommand

from scheduler.loop import SchedulerLoop


class Command(BaseCommand):
    help = "Run the scheduler loop in the foreground (passes, sync with the backend, housekeeping)."

    def add_arguments(self, parser):
        parser.add_argument("--interval", type=float, default=None)

    def handle(self, *args, interval, **options):
        loop = SchedulerLoop(interval=interval)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: loop.stop())
        loop.start()
        while loop.is_alive():
            loop.join(timeout=1)
