"""Register (or update) an image, e.g. a local environment a lab shares: ``manage.py register_image torch
--local-root /srv/envs/torch --group phusers``. The same as Django admin's Images page, from a shell."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from jobs.models import Group, Image


class Command(BaseCommand):
    help = "Create or update an image: its reference, its local environment and the groups that may use it."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--url", default="", help="image reference (default: the name)")
        parser.add_argument("--local-root", default=None,
                            help="local backend: the directory of its environment (a venv, a conda prefix, a rootfs)")
        parser.add_argument("--description", default=None)
        parser.add_argument("--group", action="append", default=[], help="a group that may use it (repeatable)")

    @transaction.atomic
    def handle(self, *args, name, url, local_root, description, group, **options):
        groups = list(Group.objects.filter(name__in=group))
        missing = sorted(set(group) - {g.name for g in groups})
        if missing:
            raise CommandError(f"No such group: {', '.join(missing)}")
        image = Image.objects.filter(name=name).first() or Image(name=name, url=url or name)
        if url:
            image.url = url
        if local_root is not None:
            image.local_root = local_root
        if description is not None:
            image.description = description
        try:
            image.full_clean()
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from exc
        image.save()
        image.groups.add(*groups)
        where = f", environment {image.local_root}" if image.local_root else ""
        self.stdout.write(self.style.SUCCESS(f"Image {image.name} ({image.url}{where}) for "
                                             f"{', '.join(image.groups.values_list('name', flat=True)) or 'no group'}"))
