"""The groups resource: your groups with quotas and usage, one group with what each user holds, its queue, and the
instance types and images it allows."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import exceptions, permissions, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from jobs import selectors
from jobs.models import Group

from .. import queries
from ..pagination import JobPagination
from ..serializers.groups import (
    GroupDetailSerializer,
    GroupSerializer,
    ImageSerializer,
    InstanceTypeSerializer,
    QueueEntrySerializer,
)
from .base import ApiMixin
from .query_params import GROUP_NAME_PARAM


@extend_schema_view(
    list=extend_schema(summary="Your groups, with quotas and current usage"),
    retrieve=extend_schema(summary="A group: quotas, usage, and what each user holds", parameters=[GROUP_NAME_PARAM]),
)
@extend_schema(tags=["groups"])
class GroupViewSet(ApiMixin, viewsets.GenericViewSet):
    """Groups you belong to (all for superusers); others do not exist for you (404)."""

    permission_classes = [permissions.IsAuthenticated]
    pagination_class = JobPagination
    filter_backends: list = []
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    serializer_class = GroupSerializer
    queryset = Group.objects.none()

    def get_queryset(self):
        return selectors.groups_of(self.request.user).order_by("name")

    def get_object(self) -> Group:
        group = queries.visible_group(self.request.user, self.kwargs["name"])
        if group is None:
            raise exceptions.NotFound(f"No group '{self.kwargs['name'][:63]}' of yours.")
        return group

    def _rows(self, groups: list[Group]) -> list[dict]:
        overview = queries.groups_overview(self.request.user, groups)
        return [{"name": g.name, "display_name": g.display_name, "description": g.description,
                 "queue_stopped": g.queue_stopped, **overview[g.pk]} for g in groups]

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(GroupSerializer(self._rows(list(page)), many=True).data)

    @extend_schema(responses={200: GroupDetailSerializer})
    def retrieve(self, request: Request, name: str | None = None) -> Response:
        group = self.get_object()
        [row] = self._rows([group])
        row["users"] = selectors.group_user_usage(group)
        return Response(GroupDetailSerializer(row).data)

    @extend_schema(summary="A group's queue in order, with each job's reason and position",
                   parameters=[GROUP_NAME_PARAM], responses={200: QueueEntrySerializer(many=True)})
    @action(detail=True, methods=["get"])
    def queue(self, request: Request, name: str | None = None) -> Response:
        group = self.get_object()
        page = self.paginate_queryset(selectors.group_queue(group))
        first = self.paginator.page.start_index() if page else 1
        rows = [
            {"rank": first + i, "queue_position": j.queue_position, "id": j.pk, "name": j.name,
             "user": j.user.get_username(), "instance_type": j.instance_type.name, "replicas": j.replicas,
             "request": {str(r): amount for r, amount in j.total_request.items()},
             "priority": j.priority, "preemptible": j.preemptible, "phase": j.phase, "status": j.status,
             "color": j.color, "reason": j.reason, "message": j.message, "queued_at": j.queued_at,
             "estimated_start": j.estimated_start, "estimate_basis": j.estimate_basis}
            for i, j in enumerate(page)
        ]
        return self.get_paginated_response(QueueEntrySerializer(rows, many=True).data)

    @extend_schema(summary="Instance types allowed in a group", parameters=[GROUP_NAME_PARAM],
                   responses={200: InstanceTypeSerializer(many=True)})
    @action(detail=True, methods=["get"], url_path="instance-types", url_name="instance-types")
    def instance_types(self, request: Request, name: str | None = None) -> Response:
        group = self.get_object()
        page = self.paginate_queryset(selectors.instance_types_for(group).order_by("gpu", "name"))
        return self.get_paginated_response(InstanceTypeSerializer(page, many=True).data)

    @extend_schema(summary="Images allowed in a group", parameters=[GROUP_NAME_PARAM],
                   responses={200: ImageSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def images(self, request: Request, name: str | None = None) -> Response:
        group = self.get_object()
        page = self.paginate_queryset(selectors.images_for(group).order_by("name"))
        return self.get_paginated_response(ImageSerializer(page, many=True).data)
