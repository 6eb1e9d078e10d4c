from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from .views import GroupViewSet, JobViewSet, NotFoundApi, TokenApi, UsageApi, UtilisationApi, VocabulariesApi

app_name = "api"

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("groups", GroupViewSet, basename="group")

urlpatterns = [
    path("auth/token/", TokenApi.as_view(), name="token"),
    *router.urls,
    path("utilisation/", UtilisationApi.as_view(), name="utilisation"),
    path("usage/", UsageApi.as_view(), name="usage"),
    path("vocabularies/", VocabulariesApi.as_view(), name="vocabularies"),
    # Last: any other path ending in "/" is a 404 in the API's error shape (paths without the slash still get
    # Django's APPEND_SLASH redirect).
    re_path(r"^.*/$", NotFoundApi.as_view(), name="not-found"),
]
