from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from jobs.metrics import metrics_view
from jobs.views import LoginView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("login/", LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its init script from a URL: no inline script, as the Content-Security-Policy asks.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/", include("jobs.api.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("", include("jobs.urls")),
]
