"""What the arrays resource takes and shows: the ``sweep`` field of a submit, and an array with its counts per
phase and (in detail) its members in index order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.reverse import reverse

from jobs.arrays import MEMBERS_MAX, ArrayError, expand_sweep
from jobs.models import JobArray


@extend_schema_field({
    "type": "object",
    "additionalProperties": {"type": "array", "minItems": 1,
                             "items": {"oneOf": [{"type": "string"}, {"type": "number"}]}},
    "description": f"A parameter grid, name: [values]: one member per point of the product (at most "
                   f"{MEMBERS_MAX:,}), each with SWEEP_<NAME>=<value> in its environment.",
    "example": {"lr": [0.0001, 0.0003], "bs": [32, 64]},
})
class SweepField(serializers.Field):
    """An object of name: [values] (strings or numbers), checked by ``jobs.arrays.expand_sweep``."""

    def to_internal_value(self, data: Any) -> dict[str, list]:
        if not isinstance(data, Mapping):
            raise serializers.ValidationError("Give the sweep as an object of name: [values].")
        try:
            expand_sweep(data)
        except ArrayError as exc:
            raise serializers.ValidationError(exc.message) from exc
        return {str(k): list(v) for k, v in data.items()}

    def to_representation(self, value: dict) -> dict:
        return value


class ArrayMemberSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    array_index = serializers.IntegerField()
    array_params = serializers.DictField(help_text="The member's sweep values (empty for an index array).")
    phase = serializers.CharField()
    status = serializers.CharField()
    reason = serializers.CharField()


class ArraySerializer(serializers.ModelSerializer):
    """An array in lists: needs ``group`` and ``user`` selected with it and ``context["counts"]`` ({array id:
    {phase: n}})."""

    group = serializers.CharField(source="group.name", read_only=True)
    user = serializers.CharField(source="user.get_username", read_only=True)
    indices = serializers.CharField(read_only=True, help_text='The array as submitted, e.g. "0-99%8" ("%2" or "" '
                                                              "for a sweep).")
    sweep = SweepField(read_only=True)
    url = serializers.SerializerMethodField()
    counts = serializers.SerializerMethodField()

    class Meta:
        model = JobArray
        fields = ["id", "name", "group", "user", "size", "max_running", "indices", "sweep", "created_at", "url",
                  "counts"]
        read_only_fields = fields

    def get_url(self, array: JobArray) -> str:
        return reverse("api:array-detail", kwargs={"pk": array.pk}, request=self.context.get("request"))

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"},
                          "description": "Members per phase (phases with members only).",
                          "example": {"PENDING": 3, "RUNNING": 2}})
    def get_counts(self, array: JobArray) -> dict[str, int]:
        return self.context.get("counts", {}).get(array.pk, {})


class ArrayDetailSerializer(ArraySerializer):
    """An array with its members in index order: needs ``context["members"]`` (``array_selectors.array_members``
    rows) besides the counts."""

    members = serializers.SerializerMethodField()

    class Meta(ArraySerializer.Meta):
        fields = [*ArraySerializer.Meta.fields, "members"]
        read_only_fields = fields

    @extend_schema_field(ArrayMemberSerializer(many=True))
    def get_members(self, array: JobArray) -> list[dict]:
        # Rows already in the members' shape (``MEMBER_FIELDS``): no serializer per member of a large array.
        return [dict(m) for m in self.context.get("members", [])]
