"""WebSocket routes (mounted by ``jobsite.asgi`` behind the origin check and session authentication)."""

from django.urls import path

from . import consumers, exec_consumers, live_detail, live_list, port_proxy

websocket_urlpatterns = [
    path("ws/jobs/", live_list.JobsConsumer.as_asgi()),
    path("ws/jobs/<int:pk>/", live_detail.JobDetailConsumer.as_asgi()),
    path("ws/jobs/<int:pk>/logs/", consumers.JobLogConsumer.as_asgi()),
    path("ws/jobs/<int:pk>/exec/", exec_consumers.ExecConsumer.as_asgi()),
    path("ws/jobs/<int:pk>/portforward/", port_proxy.PortForwardConsumer.as_asgi()),
    path("ws/groups/<slug:name>/queue/", consumers.QueueConsumer.as_asgi()),
    path("ws/utilisation/", consumers.UtilisationConsumer.as_asgi()),
]
