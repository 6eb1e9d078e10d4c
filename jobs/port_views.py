"""``/jobs/<id>/ports/<port>/...`` on the site: the job page's Open link. It serves nothing of the job's: it checks the
user may open the port (``sessions.port_target``: 404 for those who may not see the job, 409 while it is not
Running) and sends the browser to the port's own host with a ticket (``jobs.port_origin``), where the proxy is."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect

from . import port_origin
from .services import sessions


@login_required
def port_open(request: HttpRequest, pk: int, port: int, rest: str | None = None) -> HttpResponse:
    pk, port = int(pk), int(port)
    try:
        rank = int(request.GET.get("rank", "0"))
    except ValueError:
        rank = -1
    try:
        sessions.port_target(user=request.user, job_id=pk, port=port, rank=rank)
    except sessions.SessionRefused as refused:
        return HttpResponse(refused.message + "\n", status=refused.status, content_type="text/plain; charset=utf-8")
    origin = port_origin.origin_for(request.get_host(), secure=request.is_secure(), pk=pk, port=port)
    if origin is None:
        return HttpResponse(port_origin.NO_DOMAIN.format(host=request.get_host(), pk=pk, port=port), status=503,
                            content_type="text/plain; charset=utf-8")
    prefix = f"/jobs/{pk}/ports/{port}"
    following = request.get_full_path()[len(prefix):] or "/"  # the rest of the path and the query, as sent
    query = urlencode({"ticket": port_origin.ticket_mint(request.user, pk, port), "next": following})
    response = HttpResponseRedirect(f"{origin}{prefix}{port_origin.AUTH_STEP}?{query}")
    response["Cache-Control"] = "no-store"
    return response
