"""The server-rendered pages' URLs (namespace ``jobs``); the views are in ``jobs.views`` (arrays' in
``jobs.array_views``)."""

from django.urls import path, re_path

from . import array_views, notification_views, port_views, views

app_name = "jobs"
urlpatterns = [
    path("", views.job_list_page, name="list"),
    path("jobs/new/", views.submit_page, name="submit"),
    path("jobs/selected/", views.selected_jobs_action, name="bulk"),
    path("jobs/<int:pk>/", views.job_detail_page, name="detail"),
    path("jobs/<int:pk>/cancel/", views.cancel_action, name="cancel"),
    path("jobs/<int:pk>/stop/", views.stop_action, name="stop"),
    path("jobs/<int:pk>/restart/", views.restart_action, name="restart"),
    # A job's port: to its own host (jobs/port_origin.py), never served here.
    re_path(r"^jobs/(?P<pk>[1-9][0-9]*)/ports/(?P<port>[1-9][0-9]*)(?P<rest>/.*)?$", port_views.port_open, name="port"),
    path("arrays/<int:pk>/", array_views.array_page, name="array"),
    path("arrays/<int:pk>/<slug:action>/", array_views.array_action, name="array_action"),
    path("jobs/<int:pk>/attempts/<int:number>/replicas/<int:rank>/log", views.replica_log_download, name="log"),
    path("groups/<slug:name>/queue/", views.queue_page, name="queue"),
    path("utilisation/", views.utilisation_page, name="utilisation"),
    path("usage/", views.usage_page, name="usage"),
    path("notifications/", notification_views.notifications_page, name="notifications"),
    path("notifications/<int:pk>/delete/", notification_views.notification_delete_action, name="notification-delete"),
]
