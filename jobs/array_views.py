"""An array's (or sweep's) page: its members with their statuses, its counts and bar, and the actions that act on
the whole array (cancel, stop, restart the failed members) as buttons posting to ``jobs.services.arrays``.

Views stay thin: reads through ``jobs.array_selectors`` and ``jobs.list_arrays``, writes through ``jobs.services``.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from . import array_selectors, list_arrays, selectors
from .models import JobArray

ACTIONS = {
    "cancel": "cancelled",
    "stop": "stopped",
    "restart-failed": "restarted",
}


def _visible_array(request: HttpRequest, pk: int) -> JobArray:
    return get_object_or_404(array_selectors.arrays_visible_to(request.user), pk=pk)


@login_required
def array_page(request: HttpRequest, pk: int) -> HttpResponse:
    array = _visible_array(request, pk)
    context = list_arrays.array_page(array)
    context["can_act"] = array_selectors.array_can_act(request.user, array)
    context["nav_groups"] = list(selectors.groups_of(request.user).order_by("name").values_list("name", flat=True))
    return render(request, "jobs/array_detail.html", context)


@login_required
@require_POST
def array_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    """Cancel, stop or restart the failed members of an array: its owner, its group's admins and superusers."""
    array = _visible_array(request, pk)
    if action not in ACTIONS:
        raise PermissionDenied("No such action.")
    if not array_selectors.array_can_act(request.user, array):
        raise PermissionDenied(f"Only the array's owner, an admin of its group or a superuser may {action} it.")
    from .services import arrays as array_services
    try:
        result = array_services.array_act(array=array, by=request.user, action=action)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("jobs:array", pk=array.pk)
    n = result["done"]
    text = f"Array {array.pk} “{array.name}”: {n} member{'' if n == 1 else 's'} {ACTIONS[action]}."
    if result.get("skipped"):
        text += f" {result['skipped']} changed meanwhile and were left as they are."
    messages.success(request, text)
    return redirect("jobs:array", pk=array.pk)
