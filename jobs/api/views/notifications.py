"""The notifications resource: your subscriptions to events of your jobs (list, create, delete)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import exceptions, mixins, permissions, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.models import NotificationSubscription
from jobs.services.notifications import subscription_create, subscription_delete

from ..serializers.notifications import SubscriptionSerializer
from .base import ApiMixin


@extend_schema_view(
    list=extend_schema(summary="Your notification subscriptions"),
    create=extend_schema(
        summary="Subscribe to events of your jobs",
        description="By email (Django's email backend; your address unless `email` is given) or webhook (a JSON "
                    "POST with the job's id, name, phase, status, reason, url, group, user, the event and a "
                    "delivery id, also in the `X-Jobsite-Delivery` header; `slack: true` sends `{\"text\": ...}`). "
                    "A webhook to this machine or a private network is refused (400) unless the administrator "
                    "lists its host in JOBSITE_NOTIFY_ALLOW_HOSTS.",
    ),
    destroy=extend_schema(summary="Unsubscribe"),
)
@extend_schema(tags=["notifications"])
class NotificationViewSet(ApiMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """Only your own subscriptions exist for you: another user's is a 404."""

    permission_classes = [permissions.IsAuthenticated]
    serializer_class = SubscriptionSerializer
    filter_backends: list = []
    queryset = NotificationSubscription.objects.none()

    def get_queryset(self):
        return NotificationSubscription.objects.filter(user=self.request.user).order_by("id")

    def create(self, request: Request) -> Response:
        serializer = SubscriptionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        subscription = subscription_create(user=request.user, channel=data["channel"], url=data["url"],
                                           email=data["email"], slack=data["slack"], events=data["events"])
        return Response(SubscriptionSerializer(subscription).data, status=status.HTTP_201_CREATED)

    def destroy(self, request: Request, pk: str | None = None) -> Response:
        if not str(pk).isdigit() or not subscription_delete(user=request.user, subscription_id=int(pk)):
            raise exceptions.NotFound("No subscription of yours by that id.")
        return Response(status=status.HTTP_204_NO_CONTENT)
