from django.urls import path
from rest_framework.routers import SimpleRouter

from .views import JobViewSet, TokenObtainApi

app_name = "api"

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")

urlpatterns = [
    path("auth/token/", TokenObtainApi.as_view(), name="token"),
    *router.urls,
]
