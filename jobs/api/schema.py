"""OpenAPI generation (drf-spectacular): the error shape on every operation, strict request bodies.

``AutoSchema`` (REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]) adds the error responses each operation can give, all in
the one shape of ``jobs.api.exceptions``, so that a client (or schemathesis) finds every status code documented.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

from .body_limit import max_body_text
from .serializers.jobs import VOCABULARY_FIELDS


class ErrorSerializer(serializers.Serializer):
    """Every error response: ``detail`` for a person, ``errors`` per field path (empty unless fields were bad)."""

    detail = serializers.CharField(help_text="What went wrong, in one line.")
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        help_text="Field path (e.g. `replicas`, `env`, `ids.3`, or a query parameter) → messages.",
    )


ERRORS = {
    "400": "Invalid input: a body or query parameter failed validation (see `errors`), or the action is not "
           "possible in the job's current state.",
    "401": "Not authenticated: send `Authorization: Token <token>` (from POST /api/v1/auth/token/).",
    "403": "You may see this job but not act on it (only its owner, its group's admins and superusers may).",
    "404": "No such object, or it belongs to a group you are not in.",
    "406": "The Accept header asks for a format this operation cannot give.",
    "409": "The job changed while the request ran; reload it and try again.",
    "413": "The request body is larger than {max_body}.",
    "415": "Unsupported Content-Type (use application/json, or application/yaml for job specs).",
}
READ_ERRORS = ("400", "401", "404", "406")
WRITE_ERRORS = ("400", "401", "403", "404", "406", "409", "413", "415")


class AutoSchema(SpectacularAutoSchema):
    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        codes = READ_ERRORS if self.method in ("GET", "HEAD", "OPTIONS") else WRITE_ERRORS
        for code in codes:
            if code not in responses:
                description = ERRORS[code].format(max_body=max_body_text())
                responses[code] = self._get_response_for_code(
                    OpenApiResponse(ErrorSerializer, description=description), code, direction=direction
                )
        return responses


class StrictSerializerExtension(OpenApiSerializerExtension):
    """Request bodies that name unknown fields as errors say so: ``additionalProperties: false``."""

    target_class = "jobs.api.serializers.fields.StrictSerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_basic_serializer(self.target, direction)
        if direction == "request":
            schema["additionalProperties"] = False
        return schema


def optional_vocabulary_fields(result, generator, request, public):
    """Postprocessing hook: ``vocabulary_*`` appear only with ``?vocabulary=``, so they are never required."""
    for schema in result.get("components", {}).get("schemas", {}).values():
        required = schema.get("required")
        if required and any(name in required for name in VOCABULARY_FIELDS):
            schema["required"] = [name for name in required if name not in VOCABULARY_FIELDS]
    return result
