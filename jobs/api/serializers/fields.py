"""Field types the API's serializers share: strict JSON types for request bodies (a string is not a number), the
priority and env fields, the serializer that names unknown fields, and the resource amounts shape."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs import limits
from jobs.choices import Priority


@extend_schema_field({
    "oneOf": [
        {"type": "string", "enum": [label for _, label in Priority.choices]},
        {"type": "integer", "enum": list(Priority.values)},
    ],
    "description": "low, normal or high (or 0, 50, 100); shown as the name.",
})
class PriorityField(serializers.Field):
    """``"low" | "normal" | "high"`` or their values ``0 | 50 | 100``; shown as the name."""

    default_error_messages = {
        "invalid": "'{input}' is not a priority: use low, normal or high (or 0, 50, 100).",
    }

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool):
            self.fail("invalid", input=data)
        if isinstance(data, int) and data in Priority.values:
            return data
        if isinstance(data, str):
            text = data.strip().lower()
            for value, label in Priority.choices:
                if text in (label, str(value)):
                    return value
        self.fail("invalid", input=str(data)[:40])

    def to_representation(self, value: int) -> str | int:
        return Priority(value).label if value in Priority.values else value


@extend_schema_field({
    "type": "object",
    "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "number"}]},
    "description": "Environment variables, NAME: value (numbers are kept as strings).",
})
class EnvField(serializers.Field):
    """An object of NAME: value. Values may be strings or numbers (kept as strings)."""

    default_error_messages = {
        "not_an_object": "Give environment variables as an object of NAME: value.",
        "too_many": f"Use at most {limits.ENV_MAX_VARS} environment variables.",
        "not_a_string": "The value of '{name}' must be a string.",
        "too_long": f"The value of '{{name}}' is longer than {limits.ENV_VALUE_MAX_BYTES // 1024} KiB.",
    }

    def to_internal_value(self, data: Any) -> dict[str, str]:
        if not isinstance(data, Mapping):
            self.fail("not_an_object")
        if len(data) > limits.ENV_MAX_VARS:
            self.fail("too_many")
        env = {}
        for key, value in data.items():
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                self.fail("not_a_string", name=key)
            value = str(value)
            if len(value.encode()) > limits.ENV_VALUE_MAX_BYTES:
                self.fail("too_long", name=key)
            env[str(key)] = value
        # Names and reserved names are checked by jobs.services.job_spec_validate.
        return env

    def to_representation(self, value: dict) -> dict:
        return value


class StrictCharField(serializers.CharField):
    """A JSON string only: DRF's CharField would turn ``5`` or ``true`` into text."""

    default_error_messages = {"not_a_string": "Give a string, not {kind}."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("not_a_string", kind=_json_kind(data))
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON whole number only: DRF's IntegerField would take ``"5"``, ``5.0`` or ``true``."""

    default_error_messages = {"not_an_integer": "Give a whole number, not {kind}."}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("not_an_integer", kind=_json_kind(data))
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """``true`` or ``false`` only: DRF's BooleanField would take ``"yes"``, ``"0"`` or ``1``."""

    default_error_messages = {"not_a_boolean": "Give true or false, not {kind}."}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("not_a_boolean", kind=_json_kind(data))
        return data


def _json_kind(data: Any) -> str:
    """How a value reads in a message: 'a number (5)', 'a list', ..."""
    if data is None:
        return "null"
    if isinstance(data, bool):
        return f"a boolean ({str(data).lower()})"
    if isinstance(data, int | float):
        return f"a number ({str(data)[:20]})"
    if isinstance(data, str):
        return f"a string ({data[:20]!r})"
    if isinstance(data, Mapping):
        return "an object"
    if isinstance(data, list | tuple):
        return "a list"
    return type(data).__name__


class StrictSerializer(serializers.Serializer):
    """Names every field of the body it does not know, with the other errors; accepts only an object."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        unknown = {}
        if isinstance(data, Mapping):
            unknown = {str(key): ["Unknown field."] for key in data if key not in self.fields}
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if unknown and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**exc.detail, **unknown}) from exc
            raise
        if unknown:
            raise serializers.ValidationError(unknown)
        return value


class ResourceAmountsSerializer(serializers.Serializer):
    gpu = serializers.IntegerField(help_text="GPUs")
    cpu = serializers.IntegerField(help_text="CPU in millicores")
    memory = serializers.IntegerField(help_text="Memory in bytes")


class FieldsBuiltOnce:
    """A serializer whose fields are worked out once per class, then copied for each instance: ``get_fields``
    depends on the class alone (its Meta and declared fields), and working it out (the model's field info, a field
    built per column) cost more than the rest of a job's answer. The copies are unbound, as ``get_fields`` returns
    them.

    A plain field is copied shallowly (its attributes, as ``copy.copy`` does): binding it sets attributes of its own
    (name, parent, source), and reading or validating a value changes nothing of it (a deep copy builds the field
    again from its arguments: a fifth of a submit's CPU). A field holding another (a nested serializer, a list's
    child) is copied deeply, so that no two requests share the inner one, bound to one of them."""

    def get_fields(self):
        cls = type(self)
        built = cls.__dict__.get("_fields_built_once")
        if built is None:
            fields = super().get_fields()
            built = cls._fields_built_once = [(name, field, _holds_fields(field)) for name, field in fields.items()]
        return {name: copy.deepcopy(field) if deep else _shallow_copy(field) for name, field, deep in built}


def _shallow_copy(field: serializers.Field) -> serializers.Field:
    """``copy.copy`` of a field without its generic route (``__reduce_ex__``, then ``_reconstruct``): a fourth of
    the time, for the 50 to 100 fields a request's serializers copy."""
    new = object.__new__(type(field))
    new.__dict__.update(field.__dict__)
    return new


def _holds_fields(field: serializers.Field) -> bool:
    """A nested serializer, or a field with a child (ListField, DictField) or a child relation."""
    return isinstance(field, serializers.BaseSerializer) or any(hasattr(field, a) for a in ("child", "child_relation"))


_in_thread = threading.local()


def _kept(serializer_class: type[serializers.BaseSerializer]) -> serializers.BaseSerializer:
    """The serializer of ``serializer_class`` this thread keeps (made bare: the caller sets what it works on); what
    a call left in it (its data, its validated data, its errors) is dropped."""
    kept = _in_thread.__dict__.setdefault("serializers", {})
    serializer = kept.get(serializer_class)
    if serializer is None:
        serializer = kept[serializer_class] = serializer_class()
    for left in ("_data", "_validated_data", "_errors"):
        serializer.__dict__.pop(left, None)
    return serializer


def represented(serializer_class: type[serializers.BaseSerializer], instance: Any,
                context: dict[str, Any]) -> dict[str, Any]:
    """``serializer_class(instance, context=context).data``, by one serializer of that class kept per thread, its
    fields (and its nested serializers' fields) bound once: only ``instance`` and ``context`` change from one call
    to the next. For serializers whose fields keep nothing of a representation or a validation (DRF's own, and
    this project's: a method field reads its object and the context when called). Building the fields of a job's
    detail and of its attempts for each answer took 7–9 % of a web process's samples in the submit benchmark."""
    serializer = _kept(serializer_class)
    serializer.instance, serializer._context = instance, context
    return serializer.data


def validated(serializer_class: type[serializers.BaseSerializer], data: Any) -> dict[str, Any]:
    """``serializer_class(data=data)``'s validated data, or its ``ValidationError``, by one serializer of that
    class kept per thread (as ``represented``)."""
    serializer = _kept(serializer_class)
    serializer.initial_data = data
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data
