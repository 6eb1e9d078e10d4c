"""Replay a workload on the simulated backend in virtual time (``scheduler.simulation``), or the recent history under
changed quotas."""

from django.core.management.base import BaseCommand, CommandError

from scheduler.simulation.history import workload_from_history
from scheduler.simulation.replay import Replay
from scheduler.simulation.report import compare_lines, report_lines
from scheduler.simulation.workload import (
    WorkloadError,
    load_workload,
    parse_quota_overrides,
    unknown_groups,
    with_quotas,
)


class Command(BaseCommand):
    help = ("Replay WORKLOAD.jsonl (one job a line: submit, group, user, gpus, duration, ...) on simulated nodes in "
            "virtual time, through the scheduler's own decisions, and print the wall time, the makespan, GPU usage "
            "and the waits per group. --from-history DAYS replays the jobs of the last DAYS days under the actual "
            "and the --quota-changed GPU quotas and prints their waits side by side.")

    def add_arguments(self, parser):
        parser.add_argument("workload", nargs="?", help="a JSON Lines workload file")
        parser.add_argument("--nodes", type=int, help="simulated nodes (default: the workload's header, else 1)")
        parser.add_argument("--gpus-per-node", type=int, help="GPUs of each node (default: the header's, else 8)")
        parser.add_argument("--quota", action="append", default=[], metavar="GROUP=GPUS",
                            help="a group's GPU quota for this replay (repeatable)")
        parser.add_argument("--from-history", type=float, metavar="DAYS",
                            help="replay the jobs of the last DAYS days from the database instead of a file")

    def handle(self, *args, workload, nodes, gpus_per_node, quota, from_history, **options):
        for name, value in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node)):
            if value is not None and value < 1:
                raise CommandError(f"{name} must be at least 1")
        if (workload is None) == (from_history is None):
            raise CommandError("give either a WORKLOAD.jsonl file or --from-history DAYS")
        try:
            quotas = parse_quota_overrides(quota)
            if from_history is not None:
                return self._what_if(from_history, quotas, nodes, gpus_per_node)
            loaded = load_workload(workload)
        except WorkloadError as exc:
            raise CommandError(f"{workload or 'history'}: {exc}") from None
        unknown = unknown_groups(loaded, quotas)
        if unknown:
            raise CommandError(f"--quota names groups the workload does not have: {', '.join(unknown)}")
        run = Replay(with_quotas(loaded, quotas), nodes=nodes, gpus_per_node=gpus_per_node)
        result = run.run()
        self.stdout.write("\n".join([f"workload: {workload}", *report_lines(result, layout=run.layout)]))

    def _what_if(self, days: float, quotas: dict[str, int], nodes, gpus_per_node) -> None:
        if days <= 0:
            raise CommandError("--from-history takes a number of days above 0")
        history = workload_from_history(days)
        unknown = unknown_groups(history.workload, quotas)
        if unknown:
            raise CommandError(f"--quota names groups that have no quota and no job: {', '.join(unknown)}")
        actual = Replay(history.workload, nodes=nodes, gpus_per_node=gpus_per_node).run()
        changed = Replay(with_quotas(history.workload, quotas), nodes=nodes, gpus_per_node=gpus_per_node).run()
        self.stdout.write("\n".join(compare_lines(history, actual, changed, quotas)))
