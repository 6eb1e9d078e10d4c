"""The job page's dependencies: ``{% job_dependencies_of job as deps %}`` reads what the job waits for and what
waits for it, as the viewer may see them (``jobs.dependency_selectors``)."""

from __future__ import annotations

from django import template

from ..dependency_selectors import JobDependencies, job_dependencies

register = template.Library()


@register.simple_tag(takes_context=True)
def job_dependencies_of(context: template.Context, job) -> JobDependencies:
    request = context.get("request")
    user = getattr(request, "user", None)
    return job_dependencies(job, user if user is not None and user.is_authenticated else None)
