"""The admin's users: Django's user admin without the permission groups jobsite does not use."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import Group as PermissionGroup

# Django's own permission groups are not used (a team is a jobsite Group, joined through a membership; staff get
# permissions one by one): hidden, so the admin has one "Groups", jobsite's. The user page loses its groups field.
admin.site.unregister(PermissionGroup)
admin.site.unregister(get_user_model())


@admin.register(get_user_model())
class SiteUserAdmin(UserAdmin):
    """Django's user admin without the unused permission groups."""

    list_filter = tuple(f for f in UserAdmin.list_filter if f != "groups")
    filter_horizontal = tuple(f for f in UserAdmin.filter_horizontal if f != "groups")
    fieldsets = tuple((title, {**options, "fields": tuple(f for f in options["fields"] if f != "groups")})
                      for title, options in UserAdmin.fieldsets)
