"""The Django admin: group usage and quotas, instance types, read-only jobs and events, access."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from jobs.choices import Phase, Resource
from jobs.models import Group, GroupQuota, InstanceType, Job, JobEvent
from jobs.services import event_record
from jobs.state_machine import Color
from scheduler.passes import schedule_pass

GIB = 1 << 30


@pytest.fixture
def admin_client(client, world):
    client.force_login(world.users["admin"])
    return client


def group_form_data(group: Group, quotas: list[dict], **overrides) -> dict:
    """The POST body of the group change form: the group's fields, its quota rows and no membership rows."""
    data = {
        "name": group.name,
        "display_name": group.display_name,
        "description": group.description,
        "volume_path": group.volume_path,
        "images": [str(pk) for pk in group.images.values_list("pk", flat=True)],
        "instance_types": [str(pk) for pk in group.instance_types.values_list("pk", flat=True)],
        "quotas-TOTAL_FORMS": str(len(quotas)),
        "quotas-INITIAL_FORMS": str(sum(1 for q in quotas if q.get("id"))),
        "quotas-MIN_NUM_FORMS": "0",
        "quotas-MAX_NUM_FORMS": "1000",
        "memberships-TOTAL_FORMS": "0",
        "memberships-INITIAL_FORMS": "0",
        "memberships-MIN_NUM_FORMS": "0",
        "memberships-MAX_NUM_FORMS": "1000",
    }
    if group.queue_stopped:
        data["queue_stopped"] = "on"
    for i, q in enumerate(quotas):
        for key in ("id", "resource", "quota", "limit", "user_quota"):
            value = q.get(key)
            data[f"quotas-{i}-{key}"] = "" if value is None else str(value)
        data[f"quotas-{i}-group"] = str(group.pk)
    data.update(overrides)
    return data


def gpu_quota_row(group: Group, **changes) -> dict:
    q = GroupQuota.objects.get(group=group, resource=Resource.GPU)
    row = {"id": q.pk, "resource": q.resource, "quota": q.quota, "limit": q.limit, "user_quota": q.user_quota}
    row.update(changes)
    return row


# --- access ---------------------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/admin/", "/admin/jobs/group/", "/admin/jobs/job/"])
def test_non_staff_user_is_sent_to_the_admin_login(client, world, url):
    client.force_login(world.users["bob"])
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


@pytest.mark.django_db
def test_admin_index_lists_the_jobs_models(admin_client):
    response = admin_client.get("/admin/")
    assert response.status_code == 200
    for name in ["Groups", "Instance types", "Images", "Jobs", "Job events", "Memberships"]:
        assert name in response.content.decode()


# --- groups ---------------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_group_changelist_shows_members_and_gpu_usage(admin_client, world, submit):
    job = submit("bob", "gpu-2", group="phusers")
    schedule_pass()
    job.refresh_from_db()
    assert job.phase == Phase.PREPARING

    response = admin_client.get(reverse("admin:jobs_group_changelist"))
    assert response.status_code == 200
    html = response.content.decode()
    rows = {m.group(1): m.group(0) for m in re.finditer(r'<tr[^>]*>.*?>(phusers|research|other)</a>.*?</tr>',
                                                        html, re.S)}
    assert set(rows) == {"phusers", "research", "other"}
    assert "2 GPU / 4 GPU" in rows["phusers"]
    assert "0 GPU / 8 GPU" in rows["research"]
    assert "0 GPU / unlimited" in rows["other"]
    assert re.search(r'<td class="field-members_count">3</td>', rows["phusers"])


@pytest.mark.django_db
def test_group_changelist_query_count_does_not_grow_with_groups(admin_client, world, submit):
    url = reverse("admin:jobs_group_changelist")
    submit("bob", "gpu-2")
    schedule_pass()
    admin_client.get(url)  # warm up (session, content types)
    with CaptureQueriesContext(connection) as few:
        assert admin_client.get(url).status_code == 200
    for i in range(25):
        g = Group.objects.create(name=f"team-{i}")
        GroupQuota.objects.create(group=g, resource=Resource.GPU, quota=i)
    with CaptureQueriesContext(connection) as many:
        response = admin_client.get(url)
    assert "team-24" in response.content.decode()
    assert len(many) == len(few), [q["sql"] for q in many.captured_queries]
    assert len(many) <= 10


@pytest.mark.django_db
def test_group_change_page_shows_quota_usage_and_allowed_lists(admin_client, world, submit):
    submit("bob", "gpu-2")
    schedule_pass()
    group = world.groups["phusers"]
    response = admin_client.get(reverse("admin:jobs_group_change", args=[group.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    assert "In use" in html
    in_use = re.search(r'<td class="field-in_use">\s*<p>(.*?)</p>', html, re.S)
    assert in_use and in_use.group(1).strip() == "2 GPU"
    assert "quota 4 GPU, limit 4 GPU, per user 4 GPU" in html
    assert "2 GPU, 16 CPU, 64 GiB" in html  # the usage summary
    # The allowed images and instance types are on the group page, selected.
    assert re.search(rf'<option value="{world.image.pk}" selected>base-notebook</option>', html)
    assert re.search(rf'<option value="{world.types["gpu-4"].pk}" selected>gpu-4</option>', html)


@pytest.mark.django_db
def test_quota_with_limit_below_quota_is_a_form_error(admin_client, world):
    group = world.groups["phusers"]
    url = reverse("admin:jobs_group_change", args=[group.pk])
    response = admin_client.post(url, group_form_data(group, [gpu_quota_row(group, quota=4, limit=2)]))
    assert response.status_code == 200  # the form again, with the error
    html = response.content.decode()
    assert "The limit (2 GPU) must be at least the quota (4 GPU)" in html
    assert "groupquota_limit_gte_quota" not in html
    q = GroupQuota.objects.get(group=group, resource=Resource.GPU)
    assert (q.quota, q.limit) == (4, None)


@pytest.mark.django_db
def test_new_quota_row_with_limit_below_quota_is_a_form_error(admin_client, world):
    group = world.groups["phusers"]
    url = reverse("admin:jobs_group_change", args=[group.pk])
    rows = [gpu_quota_row(group), {"resource": Resource.CPU, "quota": 8000, "limit": 4000}]
    response = admin_client.post(url, group_form_data(group, rows))
    assert response.status_code == 200
    assert "The limit (4 CPU) must be at least the quota (8 CPU)" in response.content.decode()
    assert not GroupQuota.objects.filter(group=group, resource=Resource.CPU).exists()


@pytest.mark.django_db
def test_group_change_saves_quotas_and_allowed_lists(admin_client, world, django_capture_on_commit_callbacks):
    group = world.groups["phusers"]
    url = reverse("admin:jobs_group_change", args=[group.pk])
    rows = [gpu_quota_row(group, limit=6), {"resource": Resource.MEMORY, "quota": 64 * GIB, "user_quota": 32 * GIB}]
    data = group_form_data(group, rows, display_name="Physics users",
                           instance_types=[str(world.types["gpu-1"].pk)], images=[])
    with django_capture_on_commit_callbacks() as callbacks:
        response = admin_client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    group.refresh_from_db()
    assert group.display_name == "Physics users"
    assert GroupQuota.objects.get(group=group, resource=Resource.GPU).limit == 6
    assert GroupQuota.objects.get(group=group, resource=Resource.MEMORY).user_quota == 32 * GIB
    assert list(group.instance_types.all()) == [world.types["gpu-1"]]
    assert not group.images.exists()
    assert callbacks  # a scheduling pass is requested after commit


@pytest.mark.django_db
def test_stop_and_resume_queue_actions(admin_client, world, django_capture_on_commit_callbacks, monkeypatch):
    calls = []
    monkeypatch.setattr("jobs.admin.scheduling_pass.request_pass", lambda: calls.append(1))
    groups = [world.groups["phusers"], world.groups["research"]]
    url = reverse("admin:jobs_group_changelist")
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(url, {"action": "stop_queue", "_selected_action": [g.pk for g in groups]})
    assert response.status_code == 302
    assert set(Group.objects.filter(queue_stopped=True).values_list("name", flat=True)) == {"phusers", "research"}
    assert calls == [1]
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(url, {"action": "resume_queue", "_selected_action": [groups[0].pk]})
    assert set(Group.objects.filter(queue_stopped=True).values_list("name", flat=True)) == {"research"}
    assert calls == [1, 1]


# --- instance types and images --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_instance_type_changelist_shows_cores_and_gib(admin_client, world):
    response = admin_client.get(reverse("admin:jobs_instancetype_changelist"))
    html = response.content.decode()
    assert response.status_code == 200
    row = re.search(r"<tr[^>]*>.*?>gpu-1</a>.*?</tr>", html, re.S).group(0)
    assert "8 CPU" in row and "32 GiB" in row


@pytest.mark.django_db
def test_instance_type_add_in_cores_and_gib(admin_client, world):
    data = {
        "name": "cpu-half", "display_name": "", "description": "", "gpu": "0", "cpu_cores": "0.5",
        "memory_gib": "1.5", "node_selector": '{"pool": "cpu"}', "tolerations": "[]",
        "groups": [str(world.groups["other"].pk)],
    }
    response = admin_client.post(reverse("admin:jobs_instancetype_add"), data)
    assert response.status_code == 302, response.content.decode()[:3000]
    it = InstanceType.objects.get(name="cpu-half")
    assert (it.cpu_millicores, it.memory_bytes, it.node_selector) == (500, 3 * GIB // 2, {"pool": "cpu"})
    assert list(it.groups.all()) == [world.groups["other"]]
    page = admin_client.get(reverse("admin:jobs_instancetype_change", args=[it.pk])).content.decode()
    assert 'name="cpu_cores" value="0.5"' in page
    assert 'name="memory_gib" value="1.5"' in page


@pytest.mark.django_db
def test_instance_type_rejects_bad_tolerations(admin_client, world):
    data = {"name": "bad", "gpu": "0", "cpu_cores": "1", "memory_gib": "1", "node_selector": "{}",
            "tolerations": '{"key": "x"}'}
    response = admin_client.post(reverse("admin:jobs_instancetype_add"), data)
    assert response.status_code == 200
    assert "A JSON list of Kubernetes tolerations" in response.content.decode()
    assert not InstanceType.objects.filter(name="bad").exists()


@pytest.mark.django_db
def test_image_admin_pages_render(admin_client, world):
    assert admin_client.get(reverse("admin:jobs_image_changelist")).status_code == 200
    page = admin_client.get(reverse("admin:jobs_image_change", args=[world.image.pk])).content.decode()
    assert "selectfilter" in page  # filter_horizontal on groups


# --- jobs -----------------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_job_changelist_shows_status_with_its_colour(admin_client, world, submit):
    running = submit("bob", "gpu-2", name="trainer")
    waiting = submit("pan", "gpu-4", name="waiter")
    schedule_pass()
    running.refresh_from_db()
    waiting.refresh_from_db()
    response = admin_client.get(reverse("admin:jobs_job_changelist"))
    assert response.status_code == 200
    html = response.content.decode()
    badges = dict(
        (m.group(2), m.group(1))
        for m in re.finditer(r'<span class="job-status"[^>]*background:(#[0-9a-f]{6})[^>]*>([^<]+)</span>', html)
    )
    assert badges[running.status] == Color.GREEN
    assert badges[waiting.status] == Color.ORANGE
    assert waiting.reason in html


@pytest.mark.django_db
def test_job_changelist_queries_are_bounded(admin_client, world, submit, django_assert_max_num_queries):
    for i in range(30):
        submit(["bob", "pan", "lin"][i % 3], "cpu-tiny", name=f"job-{i}")
    url = reverse("admin:jobs_job_changelist")
    admin_client.get(url)
    with django_assert_max_num_queries(8):
        response = admin_client.get(url)
    assert response.status_code == 200
    assert response.content.decode().count('class="job-status"') == 30


@pytest.mark.django_db
def test_job_search_by_id_name_and_user(admin_client, world, submit):
    a = submit("bob", name="alpha")
    b = submit("pan", name="beta")
    url = reverse("admin:jobs_job_changelist")

    def found(q):
        html = admin_client.get(url, {"q": q}).content.decode()
        return {j.name for j in (a, b) if f">{j.name}</a>" in html}

    assert found(f"#{b.pk}") == {"beta"}
    assert found(str(a.pk)) == {"alpha"}
    assert found("alph") == {"alpha"}
    assert found("pan") == {"beta"}


@pytest.mark.django_db
def test_job_change_page_is_read_only(admin_client, world, submit):
    job = submit("bob", "gpu-2", name="frozen")
    schedule_pass()
    job.refresh_from_db()
    url = reverse("admin:jobs_job_change", args=[job.pk])
    response = admin_client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="name"' not in html and 'name="phase"' not in html
    assert "frozen" in html and job.status in html
    assert "Attempts" in html and "Submitted" in html  # the attempts and events inlines
    assert 'name="_save"' not in html

    before = Job.objects.values().get(pk=job.pk)
    response = admin_client.post(url, {"name": "changed", "phase": Phase.SUCCEEDED, "status": "Succeeded"})
    assert response.status_code == 403
    assert Job.objects.values().get(pk=job.pk) == before
    assert admin_client.get(reverse("admin:jobs_job_add")).status_code == 403


@pytest.mark.django_db
def test_only_superusers_may_delete_jobs_and_only_ended_ones(client, world, submit, make_user):
    from django.contrib.auth.models import Permission

    live = submit("bob", name="live")
    ended = submit("bob", name="ended")
    Job.objects.filter(pk=ended.pk).update(phase=Phase.SUCCEEDED, status="Succeeded")
    staff = make_user("staff", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["view_job", "change_job", "delete_job"]))
    client.force_login(staff)
    assert client.get(reverse("admin:jobs_job_change", args=[ended.pk])).status_code == 200
    assert client.post(reverse("admin:jobs_job_delete", args=[ended.pk]), {"post": "yes"}).status_code == 403
    assert Job.objects.filter(pk=ended.pk).exists()

    client.force_login(world.users["admin"])
    # A live job cannot be deleted, neither from its page nor with the bulk action.
    assert client.post(reverse("admin:jobs_job_delete", args=[live.pk]), {"post": "yes"}).status_code == 403
    changelist = reverse("admin:jobs_job_changelist")
    response = client.post(changelist, {"action": "delete_selected", "_selected_action": [live.pk, ended.pk],
                                        "post": "yes"})
    assert response.status_code == 200
    assert "cancel it first" in response.content.decode()
    assert Job.objects.filter(pk__in=[live.pk, ended.pk]).count() == 2
    # An ended job can, with its attempts and events.
    response = client.post(reverse("admin:jobs_job_delete", args=[ended.pk]), {"post": "yes"})
    assert response.status_code == 302
    assert not Job.objects.filter(pk=ended.pk).exists()
    assert not JobEvent.objects.filter(job_id=ended.pk).exists()
    assert Job.objects.filter(pk=live.pk).exists()


@pytest.mark.django_db
def test_job_events_inline_shows_the_latest_and_links_to_all(admin_client, world, submit):
    job = submit("bob")
    for i in range(250):
        event_record(job=job, reason=f"Tick{i:03d}")
    html = admin_client.get(reverse("admin:jobs_job_change", args=[job.pk])).content.decode()
    assert "Tick249" in html and "Tick050" in html
    assert "Tick049" not in html  # older than the latest 200
    link = re.search(r'href="([^"]*job__id__exact=\d+)"', html).group(1).replace("&amp;", "&")
    other = submit("pan", name="other-job")
    response = admin_client.get(link)
    assert response.status_code == 200
    page = response.content.decode()
    assert "Tick249" in page and "251 job events" in page  # 250 ticks and the submission
    assert f"#{other.pk} other-job" not in page


@pytest.mark.django_db
def test_event_admin_is_read_only_and_searchable(admin_client, world, submit, django_assert_max_num_queries):
    a = submit("bob", name="alpha")
    b = submit("pan", name="beta")
    event_record(job=b, reason="Odd", message="something odd")
    url = reverse("admin:jobs_jobevent_changelist")
    admin_client.get(url)
    with django_assert_max_num_queries(8):
        html = admin_client.get(url).content.decode()
    assert "something odd" in html
    assert f"#{a.pk} alpha" in html
    by_job = admin_client.get(url, {"q": f"#{b.pk}"}).content.decode()
    assert "something odd" in by_job and "alpha" not in by_job
    assert "something odd" not in admin_client.get(url, {"q": "Submitted"}).content.decode()
    event = JobEvent.objects.get(reason="Odd")
    change = reverse("admin:jobs_jobevent_change", args=[event.pk])
    assert admin_client.get(change).status_code == 200
    assert admin_client.post(change, {"reason": "Even"}).status_code == 403
    assert admin_client.get(reverse("admin:jobs_jobevent_add")).status_code == 403
    event.refresh_from_db()
    assert event.reason == "Odd"


@pytest.mark.django_db
def test_group_add_with_quota_members_and_allowed_lists(admin_client, world):
    url = reverse("admin:jobs_group_add")
    assert admin_client.get(url).status_code == 200
    data = {
        "name": "vision", "display_name": "Vision", "description": "", "volume_path": "",
        "images": [str(world.image.pk)], "instance_types": [str(world.types["gpu-1"].pk)],
        "quotas-TOTAL_FORMS": "1", "quotas-INITIAL_FORMS": "0", "quotas-MIN_NUM_FORMS": "0",
        "quotas-MAX_NUM_FORMS": "1000",
        "quotas-0-resource": Resource.GPU, "quotas-0-quota": "2", "quotas-0-limit": "4", "quotas-0-user_quota": "1",
        "memberships-TOTAL_FORMS": "1", "memberships-INITIAL_FORMS": "0", "memberships-MIN_NUM_FORMS": "0",
        "memberships-MAX_NUM_FORMS": "1000",
        "memberships-0-user": str(world.users["lin"].pk), "memberships-0-role": "admin",
    }
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    group = Group.objects.get(name="vision")
    q = group.quotas.get()
    assert (q.resource, q.quota, q.limit, q.user_quota) == (Resource.GPU, 2, 4, 1)
    assert list(group.memberships.values_list("user__username", "role")) == [("lin", "admin")]
    assert list(group.images.all()) == [world.image]
    assert list(group.instance_types.all()) == [world.types["gpu-1"]]


@pytest.mark.django_db
def test_group_change_page_queries_do_not_grow_with_quotas(admin_client, world):
    group = world.groups["phusers"]
    url = reverse("admin:jobs_group_change", args=[group.pk])
    admin_client.get(url)
    with CaptureQueriesContext(connection) as few:
        admin_client.get(url)
    GroupQuota.objects.create(group=group, resource=Resource.CPU, quota=64000)
    GroupQuota.objects.create(group=group, resource=Resource.MEMORY, quota=256 * GIB)
    with CaptureQueriesContext(connection) as more:
        html = admin_client.get(url).content.decode()
    assert "256 GiB" in html and "64 CPU" in html
    assert len(more) == len(few)


@pytest.mark.django_db
def test_membership_admin_and_user_autocomplete(admin_client, world):
    assert admin_client.get(reverse("admin:jobs_membership_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:jobs_membership_add")).status_code == 200
    response = admin_client.get(
        reverse("admin:autocomplete"),
        {"app_label": "jobs", "model_name": "membership", "field_name": "user", "term": "bo"},
    )
    assert response.status_code == 200
    assert [r["text"] for r in response.json()["results"]] == ["bob"]


@pytest.mark.django_db
def test_instance_type_with_odd_memory_saves_back_unchanged(admin_client, world):
    it = InstanceType.objects.create(name="odd", gpu=0, cpu_millicores=1500, memory_bytes=1_000_000_000)
    url = reverse("admin:jobs_instancetype_change", args=[it.pk])
    page = admin_client.get(url).content.decode()
    cores = re.search(r'name="cpu_cores" value="([^"]+)"', page).group(1)
    gib = re.search(r'name="memory_gib" value="([^"]+)"', page).group(1)
    assert cores == "1.5"
    data = {"name": "odd", "display_name": "renamed", "description": "", "gpu": "0", "cpu_cores": cores,
            "memory_gib": gib, "node_selector": "{}", "tolerations": "[]"}
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    it.refresh_from_db()
    assert (it.display_name, it.cpu_millicores, it.memory_bytes) == ("renamed", 1500, 1_000_000_000)


def test_gpu_usage_page_shows_gpu_hours_per_group_and_user(client, world, submit):
    from datetime import timedelta

    from django.utils import timezone

    from jobs import services
    from jobs.choices import Phase
    from scheduler.passes import schedule_pass

    t0 = timezone.now() - timedelta(hours=5)
    job = submit("bob", "gpu-2")
    schedule_pass(now=t0)
    job.refresh_from_db()
    services.job_transition(job=job, phase=Phase.SUCCEEDED, exit_code=0, now=t0 + timedelta(minutes=90))
    client.force_login(world.users["admin"])
    page = client.get("/admin/jobs/gpuusage/").content.decode()
    assert "GPU usage, last 30 days" in page
    assert "<td>phusers</td><td>bob</td><td style=\"text-align:right\">3.0</td>" in page  # 2 GPU × 1.5 h
    assert "Total: <strong>3.0</strong>" in page


def test_gpu_usage_page_needs_staff(client, world):
    client.force_login(world.users["bob"])
    assert client.get("/admin/jobs/gpuusage/").status_code == 302


@pytest.mark.django_db
def test_admin_index_has_one_groups_entry_jobsites(admin_client):
    """Django's permission groups (unused) are not listed: the one "Groups" of the index is jobsite's teams."""
    html = admin_client.get("/admin/").content.decode()
    entries = re.findall(r'<th scope="row" id="[\w-]+">\s*<a href="([^"]+)"[^>]*>([^<]+)</a>', html)
    assert len(entries) >= 6
    groups = [href for href, name in entries if "group" in name.lower()]
    assert groups == [reverse("admin:jobs_group_changelist")], entries
    assert admin_client.get("/admin/auth/group/").status_code == 404


@pytest.mark.django_db
def test_the_user_page_has_no_permission_groups_field(admin_client, world):
    response = admin_client.get(reverse("admin:auth_user_change", args=[world.users["bob"].pk]))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="groups"' not in html and 'name="user_permissions"' in html
    assert admin_client.get(reverse("admin:auth_user_changelist")).status_code == 200
