"""The job list at scale: name/id search on the trigram index, keyset (cursor) pages beside numbered ones, counts
exact below JOBSITE_LIST_EXACT_COUNT_MAX and estimated (and labelled) above, the phase filter without DISTINCT."""

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.api.pagination import encode_cursor
from jobs.choices import Phase
from jobs.models import Job

from .conftest import JOBS_URL

ROOT = Path(__file__).resolve().parents[2]
on_postgres = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only")


def ids(response) -> list[int]:
    return [j["id"] for j in response.json()["results"]]


def copies(job: Job, n: int, **changes) -> list[Job]:
    """``n`` more jobs like ``job`` (bulk-inserted: no scheduler, no events)."""
    fields = {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields if f.attname != "id"}
    return Job.objects.bulk_create([Job(**{**fields, **changes}) for _ in range(n)])


# --- search -------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_search_by_name_substring_and_by_id(world, submit, client_for):
    a = submit("bob", name="resnet50-imagenet")
    b = submit("pan", name="bert-large")
    c = submit("lin", name="my-RESNET-101")
    client = client_for("bob")

    assert ids(client.get(JOBS_URL, {"q": "resnet"})) == [c.pk, a.pk]  # any case, anywhere in the name
    assert ids(client.get(JOBS_URL, {"q": "NET50-IMA"})) == [a.pk]
    assert ids(client.get(JOBS_URL, {"q": str(b.pk)})) == [b.pk]
    assert ids(client.get(JOBS_URL, {"q": f" #{b.pk} "})) == [b.pk]
    assert ids(client.get(JOBS_URL, {"q": "resnet", "user": "lin"})) == [c.pk]
    assert ids(client.get(JOBS_URL, {"q": "nothing-like-it"})) == []


@pytest.mark.django_db
def test_search_never_finds_jobs_of_other_groups(world, submit, client_for):
    theirs = submit("eve", group="other", name="secret-resnet")
    client = client_for("bob")
    assert ids(client.get(JOBS_URL, {"q": "secret"})) == []
    assert ids(client.get(JOBS_URL, {"q": str(theirs.pk)})) == []


@on_postgres
@pytest.mark.django_db
def test_name_search_can_use_the_trigram_index(world, submit):
    """Migration 0009 made the index on the expression the search filters on, and group × phase statistics."""
    from jobs import selectors

    submit("bob", name="resnet")
    jobs, _ = selectors.job_list(world.users["admin"], {"q": "resnet"})
    sql, params = jobs.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'job_name_trgm'")
        assert "gin_trgm_ops" in cursor.fetchone()[0]
        cursor.execute("SELECT stxkind FROM pg_statistic_ext WHERE stxname = 'job_group_phase_stats'")
        assert cursor.fetchone() is not None
        # Only the index's own way in left (an ordered index walk can otherwise look cheaper on a tiny table).
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "job_name_trgm" in plan


# --- cursor pages -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_cursor_walks_every_row_once_in_order_while_jobs_are_submitted(world, submit, client_for):
    seed = submit("bob", name="walk")
    copies(seed, 24)
    expected = list(Job.objects.filter(group=world.groups["phusers"]).order_by("-id").values_list("id", flat=True))
    client = client_for("bob")

    seen, pages = [], 0
    url = f"{JOBS_URL}?cursor=&page_size=4"
    while url:
        body = client.get(url).json()
        seen += [j["id"] for j in body["results"]]
        submit("pan", name=f"new-{pages}")  # newer than everything walked: must not show up, nor shift pages
        url, pages = body["next"], pages + 1
        assert pages < 20
    assert seen == expected
    assert len(seen) == len(set(seen)) == 25
    assert pages == 7  # 6 full pages and one of 1


@pytest.mark.django_db
def test_cursor_previous_links_walk_back(world, submit, client_for):
    seed = submit("bob", name="back")
    copies(seed, 9)
    expected = list(Job.objects.order_by("-id").values_list("id", flat=True))
    client = client_for("bob")

    first = client.get(JOBS_URL, {"cursor": "", "page_size": 3}).json()
    assert first["previous"] is None and "cursor=" in first["next"] and "page=" not in first["next"]
    second = client.get(first["next"]).json()
    third = client.get(second["next"]).json()
    assert [j["id"] for j in third["results"]] == expected[6:9]
    back = client.get(third["previous"]).json()
    assert [j["id"] for j in back["results"]] == expected[3:6]
    back = client.get(back["previous"]).json()
    assert [j["id"] for j in back["results"]] == expected[0:3]
    assert back["previous"] is None
    last = client.get(third["next"]).json()
    assert [j["id"] for j in last["results"]] == expected[9:]
    assert last["next"] is None


@pytest.mark.django_db
def test_cursor_keeps_the_filters_and_a_deep_page_costs_the_same_queries(world, submit, client_for):
    seed = submit("bob", name="filtered")
    copies(seed, 10)
    copies(seed, 10, phase=Phase.FAILED, status="Failed")
    client = client_for("bob")
    body = client.get(JOBS_URL, {"cursor": "", "page_size": 4, "phase": "FAILED"}).json()
    assert "phase=FAILED" in body["next"]
    walked = [j["phase"] for j in body["results"]]
    while body["next"]:
        body = client.get(body["next"]).json()
        walked += [j["phase"] for j in body["results"]]
    assert walked == ["FAILED"] * 10

    deepest = Job.objects.order_by("id").values_list("id", flat=True)[1]
    with CaptureQueriesContext(connection) as first:
        client.get(JOBS_URL, {"cursor": "", "page_size": 4})
    with CaptureQueriesContext(connection) as deep:
        client.get(JOBS_URL, {"cursor": encode_cursor([deepest], forward=True), "page_size": 4})
    assert len(first) == len(deep)
    assert not any("OFFSET" in q["sql"] for q in deep.captured_queries)


@pytest.mark.django_db
def test_bad_cursor_is_a_400_naming_it(world, client_for):
    client = client_for("bob")
    for bad in ("nonsense", "eyJwIjpbXX0", encode_cursor([1], forward=True)[:-3] + "!!!"):
        response = client.get(JOBS_URL, {"cursor": bad})
        assert response.status_code == 400, bad
        assert "cursor" in response.json()["errors"]


@pytest.mark.django_db
def test_numbered_pages_still_work_beside_the_cursor(world, submit, client_for):
    seed = submit("bob", name="paged")
    copies(seed, 4)
    body = client_for("bob").get(JOBS_URL, {"page": 2, "page_size": 2}).json()
    assert body["count"] == 5 and body["count_exact"] is True
    assert "page=3" in body["next"] and "cursor" not in body["next"]


# --- counts -------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_count_is_exact_up_to_the_threshold(world, submit, client_for, settings):
    settings.JOBSITE_LIST_EXACT_COUNT_MAX = 12
    seed = submit("bob", name="count")
    copies(seed, 11)
    for params in ({}, {"cursor": ""}):
        body = client_for("bob").get(JOBS_URL, params).json()
        assert (body["count"], body["count_exact"]) == (12, True)


@on_postgres
@pytest.mark.django_db
def test_count_is_an_estimate_above_the_threshold_and_says_so(world, submit, client_for, settings):
    settings.JOBSITE_LIST_EXACT_COUNT_MAX = 5
    seed = submit("bob", name="estimate")
    copies(seed, 29)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")
    client = client_for("bob")
    for params in ({}, {"cursor": ""}, {"phase": "SUBMITTED"}, {"q": "estimate"}):
        body = client.get(JOBS_URL, {**params, "page_size": 10}).json()
        assert body["count_exact"] is False, params
        assert body["count"] > 5, params  # never below the threshold it is known to pass
    # A list that fits on its first page is counted as it is read: exact, whatever the threshold.
    assert client.get(JOBS_URL, {"page_size": 50}).json()["count_exact"] is True
    superuser = client_for("admin").get(JOBS_URL, {"page_size": 10}).json()
    assert superuser["count_exact"] is False and superuser["count"] > 5
    # Numbered pages are not cut to the estimate: every row is on a page, the last one has no next, then a 404.
    walked, url = [], f"{JOBS_URL}?page_size=7"
    while url:
        body = client.get(url).json()
        walked += [j["id"] for j in body["results"]]
        url = body["next"]
    assert sorted(walked, reverse=True) == walked and len(set(walked)) == 30
    assert client.get(JOBS_URL, {"page_size": 7, "page": 6}).status_code == 404
    few = client.get(JOBS_URL, {"q": str(seed.pk)}).json()
    assert (few["count"], few["count_exact"]) == (1, True)


# --- phase filter -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_phase_filter_without_distinct_and_without_duplicates(world, submit, client_for):
    seed = submit("bob", name="phase")
    failed = copies(seed, 3, phase=Phase.FAILED, status="Failed")
    done = copies(seed, 2, phase=Phase.SUCCEEDED, status="Succeeded")
    client = client_for("lin")  # lin is in two groups: the membership must not repeat rows
    with CaptureQueriesContext(connection) as queries:
        response = client.get(JOBS_URL + "?phase=FAILED&phase=SUCCEEDED")
    assert ids(response) == sorted([j.pk for j in failed + done], reverse=True)
    assert response.json()["count"] == 5
    assert not any("DISTINCT" in q["sql"] for q in queries.captured_queries)
    assert ids(client.get(JOBS_URL, {"phase": "FAILED"})) == sorted([j.pk for j in failed], reverse=True)


# --- the migration on both databases ------------------------------------------------------------------------


@pytest.mark.slow
def test_migrations_apply_and_revert_on_sqlite(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env["JOBSITE_VAR_DIR"] = str(tmp_path / "var")
    (tmp_path / "var").mkdir()
    for args in (["migrate", "--noinput"], ["migrate", "--noinput", "jobs", "0008"], ["migrate", "--noinput"]):
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    db = sqlite3.connect(tmp_path / "var" / "jobsite.sqlite3")
    applied = {name for (name,) in db.execute("SELECT name FROM django_migrations WHERE app = 'jobs'")}
    assert "0009_job_name_trgm" in applied
