"""One error shape for the API: DRF's ``{field: [messages]}`` and ``{"detail": message}``.

Services raise Django's ``ValidationError``; here it becomes a 400 instead of a 500, keeping its per-field messages.
"""

from __future__ import annotations

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import exceptions, status
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from jobs.state_machine import InvalidTransition


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


def exception_handler(exc, context):
    if isinstance(exc, DjangoValidationError):
        exc = validation_error_from_django(exc)
    elif isinstance(exc, InvalidTransition):
        exc = Conflict(f"The job changed meanwhile ({exc}); reload it and try again.")
    return drf_exception_handler(exc, context)
