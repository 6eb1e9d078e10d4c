"""The job list: login, visibility, filters, pagination, columns, query count."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from jobs.models import Job

pytestmark = pytest.mark.django_db

LIST = reverse("jobs:list")


def row_ids(response) -> list[int]:
    html = response.content.decode()
    return [int(i) for i in re.findall(r'<td class="num"><a href="/jobs/(\d+)/">', html)]


@pytest.mark.parametrize(
    "url",
    [
        reverse("jobs:list"),
        reverse("jobs:submit"),
        reverse("jobs:detail", kwargs={"pk": 1}),
        reverse("jobs:log", kwargs={"pk": 1, "number": 1, "rank": 0}),
    ],
)
def test_anonymous_is_sent_to_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={url}"


def test_anonymous_cancel_is_sent_to_login_and_changes_nothing(client, submit):
    job = submit("bob")
    response = client.post(reverse("jobs:cancel", kwargs={"pk": job.pk}))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    job.refresh_from_db()
    assert job.phase == "SUBMITTED"


def test_login_form_logs_in_and_goes_to_the_list(client, world):
    page = client.get(reverse("login"))
    assert page.status_code == 200
    assert 'name="username"' in page.content.decode()
    response = client.post(reverse("login"), {"username": "bob", "password": "pw-bob"})
    assert response.status_code == 302
    assert response["Location"] == LIST


def test_login_form_shows_bad_credentials(client, world):
    response = client.post(reverse("login"), {"username": "bob", "password": "wrong"})
    assert response.status_code == 200
    assert "Please enter a correct username and password" in response.content.decode()


def test_list_shows_only_jobs_of_the_users_groups(login, submit, client):
    bobs = submit("bob", name="bob-job")
    lins = submit("lin", group="research", name="lin-research-job")
    eves = submit("eve", group="other", name="eve-job")

    login("bob")
    assert row_ids(client.get(LIST)) == [bobs.pk]

    login("eve")
    response = client.get(LIST)
    assert row_ids(response) == [eves.pk]
    assert "bob-job" not in response.content.decode()

    login("lin")  # member of phusers and research
    assert row_ids(client.get(LIST)) == [lins.pk, bobs.pk]

    login("admin")  # superuser sees everything
    assert row_ids(client.get(LIST)) == [eves.pk, lins.pk, bobs.pk]


def test_list_columns(login, submit, client, make_pending):
    for name in ("first", "second"):  # ahead of it: the position is derived from the queue order
        make_pending(submit("pan", "gpu-2", name=name))
    job = make_pending(submit("bob", "gpu-2", name="train-resnet"), message="waiting for group GPU quota 4/4")
    html = login("bob").get(LIST).content.decode()
    assert f'<a href="/jobs/{job.pk}/">train-resnet</a>' in html
    assert "#3 in phusers" in html
    assert "GroupQuota" in html
    assert "waiting for group GPU quota 4/4" in html
    assert "gpu-2" in html
    # The badge carries the status text and the colour.
    assert re.search(r'<span class="badge badge-orange" data-color="#fd8608"[^>]*>Pending</span>', html)


def test_list_queue_position_only_for_pending(login, submit, client):
    job = submit("bob")
    Job.objects.filter(pk=job.pk).update(queue_position=7)  # a stale position on a non-pending job
    assert "#7 in phusers" not in login("bob").get(LIST).content.decode()


def test_list_has_legend_and_is_live(login, client, world):
    html = login("bob").get(LIST).content.decode()
    assert '<meta http-equiv="refresh"' not in html  # rows change in place over a WebSocket (tests/live)
    assert 'data-live="jobs"' in html
    assert 'aria-label="Colour legend"' in html
    for name in ["green", "orange", "blue", "grey", "red", "lightgrey"]:
        assert f"swatch badge-{name}" in html


def test_filter_by_group(login, submit, client):
    ph = submit("lin", name="in-phusers")
    rs = submit("lin", group="research", name="in-research")
    login("lin")
    assert row_ids(client.get(LIST, {"group": "research"})) == [rs.pk]
    assert row_ids(client.get(LIST, {"group": "phusers"})) == [ph.pk]


def test_filter_by_phase(login, submit, client, make_pending):
    submitted = submit("bob")
    pending = make_pending(submit("bob"))
    login("bob")
    assert row_ids(client.get(LIST, {"phase": "PENDING"})) == [pending.pk]
    assert row_ids(client.get(LIST, {"phase": "SUBMITTED"})) == [submitted.pk]


def test_filter_by_user(login, submit, client):
    bobs = submit("bob")
    pans = submit("pan")
    login("bob")
    assert row_ids(client.get(LIST, {"user": "pan"})) == [pans.pk]
    assert row_ids(client.get(LIST, {"user": "bob"})) == [bobs.pk]


def test_filter_form_offers_only_visible_groups_and_keeps_values(login, client, world):
    html = login("bob").get(LIST, {"group": "phusers", "phase": "PENDING", "user": "pan"}).content.decode()
    assert '<option value="phusers" selected>phusers</option>' in html
    assert 'value="research"' not in html and 'value="other"' not in html
    assert '<option value="PENDING" selected>Pending</option>' in html
    assert 'name="user" value="pan"' in html


def test_filter_on_a_group_of_others_shows_nothing(login, submit, client):
    submit("eve", group="other")
    assert row_ids(login("bob").get(LIST, {"group": "other"})) == []


def test_pagination_50_per_page_and_links_keep_filters(login, submit, client):
    jobs = [submit("bob" if i % 2 else "pan") for i in range(110)]
    login("bob")
    first = client.get(LIST)
    assert len(row_ids(first)) == 50
    assert row_ids(first)[0] == jobs[-1].pk

    second = client.get(LIST, {"page": 2})
    assert row_ids(second) == [j.pk for j in reversed(jobs)][50:100]
    third = client.get(LIST, {"page": 3})
    assert len(row_ids(third)) == 10
    assert "Page 3 of 3" in third.content.decode()

    # With a filter: 55 of bob's jobs, page links keep the filter.
    filtered = client.get(LIST, {"user": "bob"})
    html = filtered.content.decode()
    assert "Page 1 of 2" in html
    assert 'href="?user=bob&amp;page=2"' in html
    page2 = client.get(LIST, {"user": "bob", "page": 2})
    assert len(row_ids(page2)) == 5
    assert set(Job.objects.filter(pk__in=row_ids(page2)).values_list("user__username", flat=True)) == {"bob"}


def test_list_bad_page_number_falls_back(login, submit, client):
    submit("bob")
    response = login("bob").get(LIST, {"page": "banana"})
    assert response.status_code == 200
    assert len(row_ids(response)) == 1


def test_list_has_no_n_plus_one(login, submit, client, make_pending, django_assert_max_num_queries):
    for i in range(30):
        job = submit(["bob", "pan", "lin"][i % 3], ["cpu-tiny", "gpu-1"][i % 2])
        if i % 4 == 0:
            make_pending(job)
    login("bob")
    # session + user + groups of the filter form + count + page + the page's derived queue positions
    with django_assert_max_num_queries(6):
        response = client.get(LIST)
    assert len(row_ids(response)) == 30


def test_header_nav(login, client, world):
    html = login("bob").get(LIST).content.decode()
    assert f'href="{reverse("jobs:submit")}"' in html
    assert 'href="/admin/"' not in html
    assert "bob" in html
    assert f'<form method="post" action="{reverse("logout")}"' in html

    html = login("admin").get(LIST).content.decode()
    assert 'href="/admin/"' in html


def test_logout_is_a_post(login, client):
    login("bob")
    response = client.post(reverse("logout"))
    assert response.status_code == 302
    assert client.get(LIST).status_code == 302


def test_empty_list_invites_to_submit(login, client):
    html = login("bob").get(LIST).content.decode()
    assert "No jobs yet" in html


def test_unknown_phase_filter_is_ignored(login, submit, client):
    job = submit("bob")
    response = login("bob").get(LIST, {"phase": "BOGUS"})
    assert response.status_code == 200
    assert row_ids(response) == [job.pk]


# --- search, and counts that stay cheap ---------------------------------------------------------------------


def test_search_box_finds_by_name_or_id_and_goes_with_the_filters(login, submit, client):
    a = submit("bob", name="resnet-50")
    b = submit("pan", name="bert-base")
    submit("lin", group="research", name="ResNet-101")  # not a group of bob's
    login("bob")
    html = client.get(LIST).content.decode()
    form = re.search(r'<form[^>]*role="search".*?</form>', html, re.S).group(0)
    assert re.search(r'<input type="search" name="q" value=""', form)  # in the filter form: submitted with them

    found = client.get(LIST, {"q": "RESNET"})
    assert row_ids(found) == [a.pk]
    assert 'name="q" value="RESNET"' in found.content.decode()  # kept in the box
    assert ">Clear</a>" in found.content.decode()
    assert row_ids(client.get(LIST, {"q": f"#{b.pk}"})) == [b.pk]
    assert row_ids(client.get(LIST, {"q": str(b.pk)})) == [b.pk]
    assert row_ids(client.get(LIST, {"q": "resnet", "user": "pan"})) == []
    assert "No jobs match these filters" in client.get(LIST, {"q": "nothing-like-it"}).content.decode()


def test_search_results_paginate_with_the_search_kept(login, submit, client):
    seed = submit("bob", name="sweep-0")
    fields = {f.attname: getattr(seed, f.attname) for f in Job._meta.concrete_fields if f.attname != "id"}
    Job.objects.bulk_create([Job(**fields) for _ in range(54)])
    html = login("bob").get(LIST, {"q": "sweep"}).content.decode()
    assert "Page 1 of 2" in html and 'href="?q=sweep&amp;page=2"' in html
    assert '<span data-total>55</span>' in html  # exact below the threshold


@pytest.mark.parametrize(("n", "said"), [(10_001, "10,000"), (123_456, "120,000"), (999_999, "1,000,000"),
                                         (1_000_000, "1 million"), (1_234_567, "1.2 million"), (42, "42")])
def test_estimated_counts_are_said_roughly(n, said):
    from jobs.views import approximately

    assert approximately(n) == said


def test_count_above_the_threshold_is_labelled_an_estimate(login, submit, client, settings):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: SQLite has no estimate to read")
    settings.JOBSITE_LIST_EXACT_COUNT_MAX = 10
    seed = submit("bob", name="many")
    fields = {f.attname: getattr(seed, f.attname) for f in Job._meta.concrete_fields if f.attname != "id"}
    Job.objects.bulk_create([Job(**fields) for _ in range(59)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")
    html = login("admin").get(LIST).content.decode()
    assert re.search(r'<span data-estimated[^>]*>about \d[\d,.]*( million)?</span>', html)
    assert "data-total" not in html  # the live page does not count on from an estimate
    assert "Page 1 of about" in html and "Last page" not in html
    assert len(row_ids(client.get(LIST))) == 50
    assert len(row_ids(client.get(LIST, {"page": 2}))) == 10
    # A member's list is estimated from the plan, which may guess low: the page still holds every row it should.
    assert len(row_ids(login("bob").get(LIST))) == 50
