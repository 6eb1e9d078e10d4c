"""Pages of the job list: numbered (``?page=``) or keyset (``?cursor=``), with a count that stays cheap.

``?page=N`` reads an OFFSET: fine for the first pages, slower the deeper it goes. ``?cursor=`` (empty for the first
page) reads the rows after an opaque position in the list's order (newest first: the job id), so every page costs
the same however deep, and jobs submitted during a walk neither repeat nor hide rows. ``count`` is exact up to
``JOBSITE_LIST_EXACT_COUNT_MAX`` and estimated above (``count_exact: false``), in both modes.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from django.db.models import Q, QuerySet
from rest_framework import exceptions
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param

from jobs import selectors

CURSOR_PARAM = "cursor"
# The list's order: the keyset's fields, ending in a unique one.
ORDERING = ("-id",)


def encode_cursor(position: list, *, forward: bool) -> str:
    """An opaque token for the rows after (``forward``) or before ``position`` (values of ``ORDERING``)."""
    raw = json.dumps({"p": position, "f": 1 if forward else 0}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(token: str) -> tuple[list, bool]:
    """The position and direction of a token of ``encode_cursor``; ``ValueError`` for anything else."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ValueError("not a cursor") from None
    if not isinstance(data, dict) or data.get("f") not in (0, 1):
        raise ValueError("not a cursor")
    position = data.get("p")
    if (not isinstance(position, list) or len(position) != len(ORDERING)
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63 for v in position)):
        raise ValueError("not a cursor")
    return position, data["f"] == 1


def _beyond(position: list, *, forward: bool) -> Q:
    """Rows after ``position`` in ``ORDERING`` (before it when not ``forward``): the lexicographic comparison."""
    match = None
    for i in reversed(range(len(ORDERING))):
        field = ORDERING[i].lstrip("-")
        strictly = Q(**{f"{field}__{'lt' if ORDERING[i].startswith('-') == forward else 'gt'}": position[i]})
        match = strictly if match is None else strictly | (Q(**{field: position[i]}) & match)
    return match


def _position(row: Any) -> list:
    return [getattr(row, f.lstrip("-")) for f in ORDERING]


class JobPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
    django_paginator_class = selectors.JobPaginator

    def paginate_queryset(self, queryset: QuerySet, request, view=None) -> list | None:
        self.request = request
        self.cursor_mode = CURSOR_PARAM in request.query_params
        if not self.cursor_mode:
            rows = super().paginate_queryset(queryset, request, view)
            self.count, self.count_exact = self.page.paginator.count, self.page.paginator.count_exact
            return rows
        token = request.query_params.get(CURSOR_PARAM, "")
        position, forward = None, True
        if token:
            try:
                position, forward = decode_cursor(token)
            except ValueError:
                raise exceptions.ValidationError(
                    {CURSOR_PARAM: ["Not a cursor of this list: use the next and previous links it gives."]}
                ) from None
        size = self.get_page_size(request)
        order = ORDERING if forward else tuple(f[1:] if f.startswith("-") else f"-{f}" for f in ORDERING)
        rows = queryset.order_by(*order)
        if position is not None:
            rows = rows.filter(_beyond(position, forward=forward))
        rows = list(rows[: size + 1])
        more = len(rows) > size
        rows = rows[:size]
        if position is None and not more:  # the whole list: counted as it is read
            self.count, self.count_exact = len(rows), True
        else:
            self.count, self.count_exact = selectors.job_count(queryset)
        if not forward:
            rows.reverse()
        has_next, has_previous = (more, position is not None) if forward else (True, more)
        self.next_position = (_position(rows[-1]) if rows else position) if has_next else None
        self.previous_position = (_position(rows[0]) if rows else position) if has_previous else None
        return rows

    def _cursor_link(self, position: list | None, *, forward: bool) -> str | None:
        if position is None:
            return None
        url = remove_query_param(self.request.build_absolute_uri(), self.page_query_param)
        return replace_query_param(url, CURSOR_PARAM, encode_cursor(position, forward=forward))

    def get_next_link(self) -> str | None:
        if self.cursor_mode:
            return self._cursor_link(self.next_position, forward=True)
        return super().get_next_link()

    def get_previous_link(self) -> str | None:
        if self.cursor_mode:
            return self._cursor_link(self.previous_position, forward=False)
        return super().get_previous_link()

    def get_paginated_response(self, data) -> Response:
        return Response({
            "count": self.count,
            "count_exact": self.count_exact,
            "next": self.get_next_link(),
            "previous": self.get_previous_link(),
            "results": data,
        })

    def get_paginated_response_schema(self, schema: dict) -> dict:
        body = super().get_paginated_response_schema(schema)
        body["properties"]["count"]["description"] = (
            "How many jobs match: exact when count_exact is true, else the database's estimate.")
        body["properties"]["count_exact"] = {"type": "boolean", "description": (
            "false: there are more than JOBSITE_LIST_EXACT_COUNT_MAX (10,000) and count is an estimate.")}
        body["properties"] = {k: body["properties"][k] for k in ("count", "count_exact", "next", "previous",
                                                                  "results")}
        body["required"] = ["count", "count_exact", "results"]
        return body

    def get_schema_operation_parameters(self, view) -> list[dict]:
        return [*super().get_schema_operation_parameters(view), {
            "name": CURSOR_PARAM, "required": False, "in": "query",
            "description": "Keyset pages, as fast however deep: give it empty for the first page, then follow the "
                           "next and previous links (their cursors are opaque). Leave out page with it.",
            "schema": {"type": "string"},
        }]
