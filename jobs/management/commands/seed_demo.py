"""Demo data: groups phusers and research, users bob/pan/lin/admin, instance types and an image. Idempotent."""

import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from jobs.choices import Resource, Role
from jobs.models import Group, GroupQuota, Image, InstanceType, Membership

DEFAULT_PASSWORD = "jobsite-demo"
GIB = 1 << 30
INSTANCE_TYPES = [
    # name, gpu, cpu millicores, memory
    ("cpu-tiny", 0, 500, 1 * GIB),
    ("gpu-1", 1, 8000, 32 * GIB),
    ("gpu-2", 2, 16000, 64 * GIB),
    ("gpu-4", 4, 32000, 128 * GIB),
]
GROUPS = {
    # name: (group GPU quota, user GPU quota, members)
    "phusers": (4, 4, ["bob", "pan", "lin"]),
    "research": (8, 4, ["lin"]),
}


class Command(BaseCommand):
    help = "Create the demo groups, users, instance types and image (safe to run again)."

    def handle(self, *args, **options):
        password = os.environ.get("DEMO_PASSWORD") or DEFAULT_PASSWORD
        created_users = self._seed(password)
        if created_users:
            shown = password if password == DEFAULT_PASSWORD else "the value of DEMO_PASSWORD"
            self.stdout.write(self.style.WARNING(f"Created users {', '.join(created_users)} with password {shown}"))
        self.stdout.write(self.style.SUCCESS("Demo data ready."))

    @transaction.atomic
    def _seed(self, password: str) -> list[str]:
        User = get_user_model()
        created_users = []
        users = {}
        for username in ["bob", "pan", "lin", "admin"]:
            user, created = User.objects.get_or_create(username=username, defaults={"email": f"{username}@example.org"})
            if created:
                user.set_password(password)
                created_users.append(username)
            if username == "admin" and not user.is_superuser:
                user.is_superuser = user.is_staff = True
            user.save()
            users[username] = user

        image, _ = Image.objects.get_or_create(
            name="base-notebook", defaults={"url": "jupyter/base-notebook:latest", "description": "Base image"}
        )
        types = []
        for name, gpu, cpu, mem in INSTANCE_TYPES:
            it, _ = InstanceType.objects.get_or_create(
                name=name, defaults={"gpu": gpu, "cpu_millicores": cpu, "memory_bytes": mem}
            )
            types.append(it)

        for name, (group_gpu, user_gpu, members) in GROUPS.items():
            group, _ = Group.objects.get_or_create(name=name, defaults={"display_name": name})
            GroupQuota.objects.get_or_create(
                group=group, resource=Resource.GPU, defaults={"quota": group_gpu, "user_quota": user_gpu}
            )
            image.groups.add(group)
            for it in types:
                it.groups.add(group)
            for username in members:
                Membership.objects.get_or_create(group=group, user=users[username], defaults={"role": Role.MEMBER})
        return created_users
