"""One FilterSet for the job list: the UI list, the API list and their tests use it."""

import django_filters

from .choices import Phase
from .models import Job


class JobFilterSet(django_filters.FilterSet):
    group = django_filters.CharFilter(field_name="group__name")
    user = django_filters.CharFilter(field_name="user__username")
    phase = django_filters.MultipleChoiceFilter(choices=Phase.choices)

    class Meta:
        model = Job
        fields = ["group", "user", "phase"]
