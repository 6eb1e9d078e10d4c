"""Django admin of jobsite, one module per model group: users; groups with their members, quotas and allowed images
and instance types; instance types and images; jobs and their events, read-only (jobs change only through
``jobs.services``); GPU usage. Importing the package registers them all."""

from django.contrib import admin  # noqa: I001

# In the order the models have always been registered (the admin's URL patterns keep their order).
from . import users, groups, catalog, jobs, usage

admin.site.site_header = "jobsite administration"
admin.site.site_title = "jobsite admin"
admin.site.index_title = "Groups, quotas, instance types, images and jobs"

__all__ = ["catalog", "groups", "jobs", "usage", "users"]
