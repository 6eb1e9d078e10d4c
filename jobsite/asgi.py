"""ASGI entry point: the Django app (HTTP). WebSocket routes join it when live push lands."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")

application = get_asgi_application()
