"""The query parameters several API operations share: their OpenAPI descriptions and their parsing (400 on bad
values, named by the parameter)."""

from __future__ import annotations

from datetime import date

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import exceptions
from rest_framework.request import Request

from jobs import vocabularies

COUNT = {"type": "integer", "minimum": 0}

VOCABULARY_PARAM = OpenApiParameter(
    "vocabulary", OpenApiTypes.STR, enum=[*vocabularies.VOCABULARIES, *vocabularies.ALIASES],
    description="Add `vocabulary_status` (and `vocabulary_code` for modelarts) to each job: its status as that "
                "scheduler would show it. See docs/status-vocabularies.md.",
)
GROUP_NAME_PARAM = OpenApiParameter(
    "name", OpenApiTypes.STR, OpenApiParameter.PATH, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    description="Group name.",
)


def vocabulary_param(request: Request) -> str | None:
    """``?vocabulary=`` normalised (None when absent); an unknown one is a 400."""
    raw = request.query_params.get("vocabulary")
    if raw is None or raw == "":
        return None
    try:
        return vocabularies.normalise(raw)
    except vocabularies.UnknownVocabulary as exc:
        raise exceptions.ValidationError({"vocabulary": [str(exc)]}) from None


def int_param(request: Request, name: str, *, default: int | None) -> int | None:
    """A whole number of at least 0 (``default`` when absent)."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise exceptions.ValidationError({name: ["Give a whole number."]}) from None
    if value < 0:
        raise exceptions.ValidationError({name: ["Give a number of at least 0."]})
    return value


def bool_param(request: Request, name: str) -> bool:
    """``true``/``1`` or ``false``/``0`` (false when absent)."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return False
    value = raw.strip().lower()
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise exceptions.ValidationError({name: ["Give true or false."]})


def date_param(request: Request, name: str) -> date | None:
    """A YYYY-MM-DD date (None when absent)."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise exceptions.ValidationError({name: ["Give a date as YYYY-MM-DD."]}) from None
