"""One FilterSet for the job list: the UI list, the API list and their tests use it."""

from datetime import UTC

import django_filters
from django import forms
from django.db.models import Q
from django_filters.fields import IsoDateTimeField

from .choices import JobType, Phase
from .models import Job


class CharInFilter(django_filters.BaseInFilter, django_filters.CharFilter):
    """``status=Running,CrashLoopBackOff``: any of the comma-separated values."""


class UTCIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 date or time, as UTC: any offset Python accepts (±23:59) is fine, not only PostgreSQL's."""

    def to_python(self, value):
        value = super().to_python(value)
        if value is None:
            return None
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise forms.ValidationError("This time is out of range.", code="invalid") from None


class UTCIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UTCIsoDateTimeField


class JobFilterSet(django_filters.FilterSet):
    group = django_filters.CharFilter(field_name="group__name")
    user = django_filters.CharFilter(field_name="user__username")
    # No DISTINCT: the list joins only to-one relations, so a job matches once (DISTINCT over every column of a
    # million jobs was most of the filter's time).
    phase = django_filters.MultipleChoiceFilter(choices=Phase.choices, distinct=False)
    status = CharInFilter(field_name="status", help_text="Status, or several separated by commas.")
    job_type = django_filters.ChoiceFilter(choices=JobType.choices)
    created_after = UTCIsoDateTimeFilter(
        field_name="created_at", lookup_expr="gte", help_text="Submitted at or after (ISO 8601 date or time)."
    )
    created_before = UTCIsoDateTimeFilter(
        field_name="created_at", lookup_expr="lt", help_text="Submitted before (ISO 8601 date or time)."
    )
    q = django_filters.CharFilter(method="search", max_length=128,
                                  help_text="Name contains this (case-insensitive), or the job id.")

    class Meta:
        model = Job
        fields = ["group", "user", "phase", "status", "job_type", "created_after", "created_before", "q"]

    def search(self, queryset, name, value):
        value = value.strip()
        if not value:
            return queryset
        match = Q(name__icontains=value)
        digits = value.lstrip("#")
        if digits.isascii() and digits.isdigit() and len(digits) < 19:
            match |= Q(pk=int(digits))
        return queryset.filter(match)
