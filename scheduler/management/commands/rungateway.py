"""The Kubernetes gateway process: exec and port-forward into job pods for the web (scheduler/gateway)."""

import signal
import threading

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = ("Serve exec and port-forward into job pods for the web (JOBSITE_GATEWAY_URL points at it): the only "
            "process holding pods/exec and pods/portforward in the jobs namespace.")

    def add_arguments(self, parser):
        parser.add_argument("--bind", default="0.0.0.0:8100", help="host:port to listen on (default 0.0.0.0:8100)")

    def handle(self, *args, bind: str, **options):
        from scheduler.gateway.server import GatewayServer

        host, _, port = bind.rpartition(":")
        server = GatewayServer((host.strip("[]") or "0.0.0.0", int(port)))
        done = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        server.start()
        self.stdout.write(f"gateway listening on {host or '0.0.0.0'}:{server.port}")
        done.wait()
        server.shutdown()
        server.server_close()
