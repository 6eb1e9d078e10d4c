"""The ports a job declares: what a submission may say (a table), the API's answers, the job page's Open links,
the job's JOB_BASE_URL, and jobctl's --port flag."""

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from jobctl.parser import build_parser
from jobctl.submit import spec_from_flags
from jobs.choices import Phase
from jobs.models import Job
from jobs.ports import ports_problems
from scheduler.launch import replica_env

pytestmark = [pytest.mark.fast]


@pytest.mark.parametrize("label, value, ports, error", [
    ("none", None, [], None),
    ("one, named", [{"name": "jupyter", "port": 8888}], [{"name": "jupyter", "port": 8888}], None),
    ("unnamed: named after its number", [{"port": 6006}], [{"name": "port-6006", "port": 6006}], None),
    ("port 0", [{"port": 0}], [], "1 to 65535"),
    ("port 65536", [{"port": 65536}], [], "1 to 65535"),
    ("a string", [{"port": "80"}], [], "1 to 65535"),
    ("twice", [{"port": 80}, {"name": "b", "port": 80}], [], "declared twice"),
    ("a name twice", [{"name": "a", "port": 80}, {"name": "a", "port": 81}], [], "used twice"),
    ("a name not slug-like", [{"name": "Jupyter Lab", "port": 80}], [], "lowercase letters"),
    ("an unknown key", [{"port": 80, "host": "x"}], [], "give"),
    ("nine", [{"port": p} for p in range(1, 10)], [], "At most 8"),
    ("not a list", {"port": 80}, [], "A list"),
])
def test_what_a_submission_may_declare(label, value, ports, error):
    got, errors = ports_problems(value)
    assert got == ports
    assert (error is None and errors == []) or any(error in e for e in errors), errors


def api(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=user)[0].key}")
    return client


SPEC = {"group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny", "command": "jupyter lab"}


@pytest.mark.django_db
def test_the_api_keeps_declared_ports_and_refuses_bad_ones_with_nothing_saved(world):
    client = api(world.users["bob"])
    bad = client.post("/api/v1/jobs/", {**SPEC, "ports": [{"port": 8888}, {"port": 8888}, {"port": 0}]},
                      format="json")
    assert bad.status_code == 400 and "ports" in bad.json()["errors"], bad.json()
    assert not Job.objects.exists()
    made = client.post("/api/v1/jobs/", {**SPEC, "ports": [{"name": "jupyter", "port": 8888}]}, format="json")
    assert made.status_code == 201, made.json()
    job = Job.objects.get()
    assert job.ports == [{"name": "jupyter", "port": 8888}] == made.json()["ports"]
    assert replica_env(job, 1, 0)["JOB_BASE_URL"] == f"/jobs/{job.pk}/ports/8888/"


@pytest.mark.django_db
def test_the_job_page_links_a_running_jobs_ports(world, submit):
    job = submit("bob", ports=[{"name": "jupyter", "port": 8888}])
    page = Client()
    page.force_login(world.users["bob"])
    assert "data-port-open" not in page.get(f"/jobs/{job.pk}/").content.decode()  # not Running: no link yet
    Job.objects.filter(pk=job.pk).update(phase=Phase.RUNNING)
    html = page.get(f"/jobs/{job.pk}/").content.decode()
    assert f'href="/jobs/{job.pk}/ports/8888/"' in html and "Open terminal" in html
    assert "JOB_BASE_URL" not in replica_env(Job.objects.get(pk=submit("bob").pk), 1, 0)


def test_jobctl_port_flags():
    args = build_parser().parse_args(["submit", "--port", "jupyter=8888", "--port", "6006", "-c", "x"])
    assert spec_from_flags(args)["ports"] == [{"name": "jupyter", "port": 8888}, {"port": 6006}]


def test_the_sites_and_the_ports_cookies_never_reach_a_job_nor_come_back_from_it(settings):
    from jobs.port_origin import PORT_COOKIE
    from jobs.port_proxy import _cookie_header, _names_site_cookie

    sent = (f"{settings.SESSION_COOKIE_NAME}=s3cret; _xsrf=abc; {settings.CSRF_COOKIE_NAME}=tok; theme=dark; "
            f"{PORT_COOKIE}=signed").encode()
    assert _cookie_header(sent) == b"_xsrf=abc; theme=dark"
    assert _names_site_cookie(f"{settings.SESSION_COOKIE_NAME}=fixed; Path=/".encode())
    assert _names_site_cookie(f"{PORT_COOKIE}=fixed; Path=/".encode())  # the port host's own login
    assert not _names_site_cookie(b"_xsrf=abc; Path=/jobs/1/ports/8888/")


def test_a_jobs_answer_cannot_reach_beyond_its_port(settings):
    from jobs.port_proxy import kept_answer_header

    assert kept_answer_header(b"content-type", b"text/html")
    assert kept_answer_header(b"set-cookie", b"_xsrf=abc; Path=/jobs/1/ports/8888/")
    assert not kept_answer_header(b"set-cookie", f"{settings.CSRF_COOKIE_NAME}=x; Path=/".encode())
    assert not kept_answer_header(b"service-worker-allowed", b"/")  # a worker answering for the site's pages
    assert not kept_answer_header(b"clear-site-data", b'"cookies", "storage"')  # logging the visitor out
    assert not kept_answer_header(b"transfer-encoding", b"chunked")
