"""ASGI entry point: the Django app for HTTP and the live WebSocket routes (``jobs.routing``).

WebSockets are authenticated at the edge: the Origin must be one of ALLOWED_HOSTS, never a job port's host, and the
user comes from the session cookie; the consumers close anonymous connections. HTTP request bodies over
JOBSITE_MAX_BODY_BYTES are refused (413) before Django reads them (``jobsite.limits``).

A request or WebSocket whose Host is a job port's own host (``j<id>-p<port>.<JOBSITE_PORTS_DOMAIN>``) goes to that
port's proxy (``jobs.port_proxy.PortHost``) and nowhere else: Django and the site's WebSockets never see it.
"""

import logging
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")

# Set Django up (apps, settings) before anything imports models.
django.setup(set_prefix=False)
from jobsite.asgi_handler import OneHopASGIHandler  # noqa: E402

django_application = OneHopASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from jobs import port_origin, port_proxy  # noqa: E402
from jobs.routing import websocket_urlpatterns  # noqa: E402
from jobsite import accept_gate, web_process  # noqa: E402
from jobsite.limits import BodySizeLimit  # noqa: E402
from jobsite.security import metrics_access_summary  # noqa: E402

logging.getLogger("jobsite").log(*metrics_access_summary())  # who may read /metrics, said once at start

ports = port_proxy.PortHost()  # j<id>-p<port>.<ports domain>: a job's web app, on a host of its own
site_websockets = port_origin.SiteOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))


async def http(scope, receive, send):
    accept_gate.answered()
    app = ports if port_origin.port_of_scope(scope) else django_application
    return await app(scope, receive, send)


async def websocket(scope, receive, send):
    accept_gate.answered()
    app = ports if port_origin.port_of_scope(scope) else site_websockets
    return await app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        # Bodies over JOBSITE_MAX_BODY_BYTES: 413 before Django reads (and spools) them.
        "http": BodySizeLimit(http),
        "websocket": websocket,
        "lifespan": web_process.lifespan,  # once at a process's start (uvicorn sends it): jobsite.web_process
    }
)
