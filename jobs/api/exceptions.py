"""One error shape for the whole API, set as DRF's EXCEPTION_HANDLER:

    {"detail": "one line for a person", "errors": {"field.path": ["message", ...], ...}}

``detail`` is always there. ``errors`` is always there too: empty unless the request had invalid fields, in which
case each key is the path of a field in the request (``replicas``, ``env``, ``ids.3``; query parameters by their
name) and each value its messages. Errors that belong to no field are in ``detail``.

Services raise Django's ``ValidationError``; here it becomes a 400 instead of a 500, keeping its per-field messages.
A transition the state machine refuses (the job changed meanwhile) is a 409.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from jobs.state_machine import InvalidTransition

log = logging.getLogger(__name__)


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "request_too_large"


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The job changed meanwhile; reload it and try again."
    default_code = "conflict"


def validation_error_from_django(exc: DjangoValidationError) -> exceptions.ValidationError:
    """``{field: [messages]}`` for a Django error with fields, ``{"detail": message}`` for a plain one."""
    if hasattr(exc, "error_dict"):
        detail = {
            (api_settings.NON_FIELD_ERRORS_KEY if field == NON_FIELD_ERRORS else field): messages
            for field, messages in exc.message_dict.items()
        }
    else:
        detail = {"detail": " ".join(exc.messages)}
    return exceptions.ValidationError(detail)


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def flatten_errors(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail as ``{dotted.path: [messages]}`` (list items by index: ``ids.3``)."""
    out: dict[str, list[str]] = {}
    if isinstance(detail, Mapping):
        for key, value in detail.items():
            key = str(key)
            if key == api_settings.NON_FIELD_ERRORS_KEY:
                path = prefix
            else:
                path = f"{prefix}.{key}" if prefix else key
            for p, messages in flatten_errors(value, path).items():
                out.setdefault(p, []).extend(messages)
    elif _is_messages(detail):
        if detail:
            out.setdefault(prefix, []).extend(str(m) for m in detail)
    elif isinstance(detail, list):
        for index, item in enumerate(detail):
            if not item:  # a valid item of a list of objects
                continue
            if isinstance(item, str):
                out.setdefault(prefix, []).append(str(item))
                continue
            for p, messages in flatten_errors(item, f"{prefix}.{index}" if prefix else str(index)).items():
                out.setdefault(p, []).extend(messages)
    else:
        out.setdefault(prefix, []).append(str(detail))
    return out


def _summary(errors: dict[str, list[str]]) -> str:
    if len(errors) == 1:
        [(path, messages)] = errors.items()
        return f"{path}: {messages[0]}"
    return "Invalid input: " + "; ".join(f"{path}: {messages[0]}" for path, messages in errors.items())


def error_body(detail: Any) -> dict[str, Any]:
    """The one error shape, from whatever DRF put in ``response.data``."""
    if isinstance(detail, Mapping) and set(detail) == {"detail"} and isinstance(detail["detail"], str):
        return {"detail": str(detail["detail"]), "errors": {}}
    flat = flatten_errors(detail)
    general = flat.pop("", []) + flat.pop("detail", [])
    if general:
        text = " ".join(general)
    elif flat:
        text = _summary(flat)
    else:
        text = "Invalid request."
    return {"detail": text, "errors": flat}


def exception_handler(exc, context):
    if isinstance(exc, DjangoValidationError):
        exc = validation_error_from_django(exc)
    elif isinstance(exc, InvalidTransition):
        exc = Conflict(f"The job changed meanwhile ({exc}); reload it and try again.")
    response = drf_exception_handler(exc, context)
    if response is None:
        # Anything else is a bug: log it, and still answer in the one shape (never an HTML page).
        log.error("unhandled error in %s", context.get("view").__class__.__name__, exc_info=exc)
        return Response({"detail": "Internal server error.", "errors": {}},
                        status=status.HTTP_500_INTERNAL_SERVER_ERROR)
    response.data = error_body(response.data)
    return response
