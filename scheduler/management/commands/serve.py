"""The embedded default: the ASGI app under uvicorn with the scheduler loop in the same process."""

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Serve the dashboard on 127.0.0.1:$PORT with the scheduler and the backend in this process."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=settings.PORT)
        parser.add_argument("--no-scheduler", action="store_true", help="Serve only; run the scheduler elsewhere.")

    def handle(self, *args, host: str, port: int, no_scheduler: bool, **options):
        import uvicorn

        from scheduler.loop import SchedulerLoop

        loop = None
        if not no_scheduler:
            loop = SchedulerLoop()
            loop.start()
        self.stdout.write(f"jobsite: dashboard on http://{host}:{port}/ (backend {settings.JOBSITE_BACKEND})")
        try:
            # lifespan on: the process prepares itself before its first request (jobsite.web_process).
            uvicorn.run("jobsite.asgi:application", host=host, port=port, log_level="info", lifespan="on",
                        ws_per_message_deflate=False)
        finally:
            if loop:
                loop.stop()
