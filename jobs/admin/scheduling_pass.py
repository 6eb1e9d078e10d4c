"""Admin changes that feed admission (quotas, queues, instance types) ask for a scheduling pass once committed."""

from __future__ import annotations

from django.db import transaction

from jobs.wakeup import request_pass


def request_pass_after_commit() -> None:
    """Quotas, queues and instance types feed admission: ask for a scheduling pass once the change is committed."""
    transaction.on_commit(request_pass)
