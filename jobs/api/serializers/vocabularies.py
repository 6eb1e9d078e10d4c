"""What the status vocabularies resource shows: the table of our statuses in other schedulers' words, and back."""

from __future__ import annotations

from rest_framework import serializers


class VocabularyRowSerializer(serializers.Serializer):
    phase = serializers.CharField()
    status = serializers.CharField(help_text="Exact status, 'Prefix*' or '*' (any other status of the phase).")
    runai = serializers.CharField(help_text="'=' means our status as it is.")
    kueue = serializers.CharField()
    mcli = serializers.CharField()
    modelarts = serializers.IntegerField()
    modelarts_name = serializers.CharField()
    primehub = serializers.CharField()
    note = serializers.CharField()


class VocabulariesSerializer(serializers.Serializer):
    vocabularies = serializers.DictField(child=serializers.CharField(), help_text="name → display name")
    aliases = serializers.DictField(child=serializers.CharField())
    rows = VocabularyRowSerializer(many=True, help_text="Ours → theirs.")
    reverse = serializers.DictField(
        child=serializers.DictField(child=serializers.CharField()), help_text="vocabulary → {their status: our phase}"
    )
