from django.urls import path

from . import views

app_name = "jobs"
urlpatterns = [
    path("", views.job_list, name="list"),
    path("jobs/new/", views.job_submit, name="submit"),
    path("jobs/selected/", views.job_bulk, name="bulk"),
    path("jobs/<int:pk>/", views.job_detail, name="detail"),
    path("jobs/<int:pk>/cancel/", views.job_cancel, name="cancel"),
    path("jobs/<int:pk>/stop/", views.job_stop, name="stop"),
    path("jobs/<int:pk>/restart/", views.job_restart, name="restart"),
    path("jobs/<int:pk>/attempts/<int:number>/replicas/<int:rank>/log", views.job_log, name="log"),
    path("groups/<slug:name>/queue/", views.group_queue, name="queue"),
    path("utilisation/", views.utilisation, name="utilisation"),
    path("usage/", views.usage, name="usage"),
]
