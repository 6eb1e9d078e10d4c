"""WebSocket routes (mounted by ``jobsite.asgi`` behind the origin check and session authentication)."""

from django.urls import path

from . import consumers, live_detail

websocket_urlpatterns = [
    path("ws/jobs/", consumers.JobsConsumer.as_asgi()),
    path("ws/jobs/<int:pk>/", live_detail.JobDetailConsumer.as_asgi()),
    path("ws/jobs/<int:pk>/logs/", consumers.JobLogConsumer.as_asgi()),
    path("ws/groups/<slug:name>/queue/", consumers.QueueConsumer.as_asgi()),
    path("ws/utilisation/", consumers.UtilisationConsumer.as_asgi()),
]
