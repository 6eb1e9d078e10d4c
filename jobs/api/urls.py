"""The API's URLs under /api/v1/: auth, jobs, groups and arrays (routers), cluster figures, vocabularies, a 404
for the rest."""

from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from .views.arrays import ArrayViewSet
from .views.cluster import UsageApi, UtilisationApi
from .views.gpu_metrics import GpuMetricsApi
from .views.groups import GroupViewSet
from .views.jobs import JobViewSet
from .views.not_found import NotFoundApi
from .views.notifications import NotificationViewSet
from .views.tokens import TokenApi
from .views.vocabularies import VocabulariesApi

app_name = "api"

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("groups", GroupViewSet, basename="group")
router.register("notifications", NotificationViewSet, basename="notification")
router.register("arrays", ArrayViewSet, basename="array")

urlpatterns = [
    path("auth/token/", TokenApi.as_view(), name="token"),
    path("jobs/<int:pk>/gpu-metrics/", GpuMetricsApi.as_view(), name="job-gpu-metrics"),
    *router.urls,
    path("utilisation/", UtilisationApi.as_view(), name="utilisation"),
    path("usage/", UsageApi.as_view(), name="usage"),
    path("vocabularies/", VocabulariesApi.as_view(), name="vocabularies"),
    # Last: any other path ending in "/" is a 404 in the API's error shape (paths without the slash still get
    # Django's APPEND_SLASH redirect).
    re_path(r"^.*/$", NotFoundApi.as_view(), name="not-found"),
]
