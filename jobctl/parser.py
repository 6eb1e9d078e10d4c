"""jobctl's command line: every command with its options and help, and the options common to all of them."""

from __future__ import annotations

import argparse

from . import __version__
from .actions import cmd_cancel, cmd_restart, cmd_stop
from .auth import cmd_login, cmd_logout
from .cluster import cmd_groups, cmd_queue, cmd_usage, cmd_util
from .exec import cmd_exec, cmd_shell
from .logs import cmd_logs
from .notify import EVENTS, cmd_notify_add, cmd_notify_list, cmd_notify_rm
from .port_forward import cmd_port_forward
from .show import cmd_describe, cmd_get, cmd_list, get_target
from .submit import cmd_clone, cmd_submit
from .top import cmd_top

EPILOG = """\
options of every command (before or after its name):
  --server URL                  jobsite to talk to
  -o, --output table|json|yaml  output format (default table)
  --color auto|always|never     statuses in the web UI's colours (auto: on a terminal, unless $NO_COLOR)

exit codes:
  0  success
  1  the server refused the request (invalid input, not allowed, not logged in, ...) or answered 5xx
  2  usage error (bad arguments, unreadable or invalid job file)
  3  cannot connect to the server
  4  not found (no such job or group, or not one of your groups)

environment:
  JOBSITE_URL      server to use when --server is not given
  XDG_CONFIG_HOME  jobctl keeps its tokens in $XDG_CONFIG_HOME/jobctl/config.json (default ~/.config/jobctl)
  NO_COLOR         set to anything to turn colours off (as --color never)

examples:
  jobctl login --server http://127.0.0.1:8000
  jobctl submit -f job.yaml
  jobctl submit -g phusers --image base-notebook -t gpu-1 -- python train.py --epochs 3
  jobctl submit -f job.yaml --array 0-99%8
  jobctl submit -f job.yaml --sweep lr=1e-4,3e-4,1e-3 --sweep bs=32,64 --array %2
  jobctl submit -f eval.yaml --after array/5:ok
  jobctl get array/5
  jobctl notify add --webhook https://hooks.example.org/jobs --slack --on ended,failed
  jobctl list --phase PENDING --phase RUNNING
  jobctl logs -f 42
  jobctl logs 42 --failed --attempt 2
  jobctl get 42 --vocabulary mcli
"""


def add_spec_flags(p: argparse.ArgumentParser, *, for_clone: bool = False) -> None:
    p.add_argument("--name", help="job name (default: from the command)")
    if not for_clone:
        p.add_argument("-g", "--group", help="group (queue) to submit to")
    p.add_argument("--image", help="image name (see jobctl groups NAME / the group's images)")
    p.add_argument("-t", "--instance-type", dest="instance_type", help="instance type, e.g. gpu-1")
    p.add_argument("-c", "--command", help="shell command to run; or after --: one word is a shell command as it "
                                           "is ('echo a; exit 3'), several a program and its arguments")
    p.add_argument("-e", "--env", action="append", metavar="NAME=VALUE", help="environment variable (repeatable)")
    p.add_argument("--port", action="append", metavar="[NAME=]PORT",
                   help="a port it serves, opened through the site (repeatable; JOB_BASE_URL: the first one's path)")
    p.add_argument("--replicas", type=int)
    p.add_argument("--type", dest="job_type", choices=["training", "interactive"])
    p.add_argument("--priority", choices=["low", "normal", "high"])
    p.add_argument("--preemptible", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--backoff-limit", dest="backoff_limit", type=int, help="retries of a failing training job")
    p.add_argument("--timeout", type=int, metavar="SECONDS", help="active deadline")
    p.add_argument("--ttl", type=int, metavar="SECONDS", help="keep pods/working dirs this long after the end")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", default=argparse.SUPPRESS, help="jobsite URL (default: $JOBSITE_URL, else the "
                                                                    "last login's, else http://127.0.0.1:8000)")
    common.add_argument("-o", "--output", choices=["table", "json", "yaml"], default=argparse.SUPPRESS,
                        help="output format (default table)")
    common.add_argument("--color", choices=["auto", "always", "never"], default=argparse.SUPPRESS,
                        help="colour statuses as the web UI does (default auto: on a terminal, unless $NO_COLOR)")

    parser = argparse.ArgumentParser(
        prog="jobctl", description="Submit, follow and manage GPU jobs on a jobsite server.", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"jobctl {__version__}")
    parser.add_argument("--server", default=None, help=argparse.SUPPRESS)
    parser.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table", help=argparse.SUPPRESS)
    parser.add_argument("--color", choices=["auto", "always", "never"], default="auto", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", required=True)

    def add(name: str, func, help_text: str, **kw) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text, **kw)
        p.set_defaults(func=func)
        return p

    p = add("login", cmd_login, "log in and save a token")
    p.add_argument("-u", "--username")
    p.add_argument("-p", "--password", help="(prompted for when not given)")
    add("logout", cmd_logout, "revoke the token on the server and forget it")

    p = add("submit", cmd_submit, "submit a job from a YAML file (-f) and/or flags",
            epilog="Flags override the file's fields. The file holds the API's fields, e.g.\n\n"
                   "  name: resnet\n  group: phusers\n  image: base-notebook\n  instance_type: gpu-1\n"
                   "  command: python train.py\n  env: {EPOCHS: '10'}\n  replicas: 1\n",
            formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-f", "--file", help="job spec in YAML ('-' for stdin)")
    p.add_argument("--vocabulary", help=argparse.SUPPRESS)
    add_spec_flags(p)
    p.add_argument("--array", metavar="INDICES", help="an array of jobs, one per index (JOB_ARRAY_INDEX), e.g. "
                                                    "0-99, 1,3,5-7; %%K runs at most K at once (0-99%%8); with "
                                                    "--sweep only the limit (%%2)")
    p.add_argument("--sweep", action="append", metavar="NAME=V1,V2",
                   help="sweep a parameter (repeatable: the grid's product), one job per combination with "
                        "SWEEP_<NAME> set; values that look like numbers are sent as numbers")
    p.add_argument("--after", action="append", metavar="ID[:ok|notok|any]",
                   help="start only after job ID (or array/ID) succeeded (ok, the default), ended without "
                        "succeeding (notok) or ended (any); repeatable")

    p = add("list", cmd_list, "list jobs of your groups, newest first")
    p.add_argument("-g", "--group")
    p.add_argument("-u", "--user")
    p.add_argument("--phase", action="append", help="phase, e.g. PENDING (repeatable)")
    p.add_argument("--status", action="append", help="status, e.g. Running (repeatable)")
    p.add_argument("--type", dest="job_type", choices=["training", "interactive"])
    p.add_argument("--since", help="submitted at or after (ISO date or time)")
    p.add_argument("--until", help="submitted before (ISO date or time)")
    p.add_argument("-q", "--search", help="name contains, or a job id")
    p.add_argument("--vocabulary", help="also show the status as runai, kueue, mcli, modelarts or primehub would")
    p.add_argument("--limit", type=int, default=50, help="jobs per page (default 50, at most 500)")
    p.add_argument("--page", type=int, default=None)
    p.add_argument("--all", action="store_true", help="every matching job (all pages)")

    p = add("get", cmd_get, "show a job's state, or an array's (array/ID) with its counts and members")
    p.add_argument("id", type=get_target, metavar="ID|array/ID")
    p.add_argument("--vocabulary", help="also show the status as runai, kueue, mcli, modelarts or primehub would")
    p = add("describe", cmd_describe, "show a job's spec, state, attempts and events")
    p.add_argument("id", type=int)
    p.add_argument("--vocabulary", help="also show the status as runai, kueue, mcli, modelarts or primehub would")

    p = add("logs", cmd_logs, "print a replica's log; -f follows it until the job ends")
    p.add_argument("id", type=int)
    p.add_argument("-f", "--follow", action="store_true")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", "--replica", dest="rank", type=int, metavar="N",
                       help="replica rank (default 0); --replica is the same")
    which.add_argument("--failed", action="store_true",
                       help="the first rank that failed in the attempt (the one whose exit code it has); with -f, "
                            "waits for a rank to fail")
    p.add_argument("--attempt", type=int, help="attempt number (default: the current one, followed across retries)")
    p.add_argument("--tail", type=int, metavar="BYTES", help="only the last BYTES bytes")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls with -f (default 1)")

    for name, func, text in (("cancel", cmd_cancel, "cancel jobs"),
                             ("stop", cmd_stop, "stop jobs (cancel that can be restarted)")):
        p = add(name, func, text)
        p.add_argument("ids", type=int, nargs="+", metavar="ID")
    p = add("top", cmd_top, "your running jobs' GPUs now: utilisation, memory, power, temperature")
    p.add_argument("ids", type=int, nargs="*", metavar="ID", help="these jobs (default: your running jobs)")
    p.add_argument("--limit", type=int, default=50, help="at most this many jobs (default 50)")
    p = add("restart", cmd_restart, "run an ended job again as a new attempt")
    p.add_argument("id", type=int)
    p = add("clone", cmd_clone, "submit a copy of a job (flags change fields of the copy)")
    p.add_argument("id", type=int)
    add_spec_flags(p, for_clone=True)

    p = sub.add_parser("notify", help="be told of your jobs' events by webhook or email",
                       description="Subscribe to events of your jobs (" + ", ".join(EVENTS) + ").")
    notify = p.add_subparsers(dest="notify_cmd", metavar="ACTION", required=True)
    p = notify.add_parser("add", parents=[common], help="subscribe: --webhook URL or --email [ADDRESS], --on EVENTS")
    p.set_defaults(func=cmd_notify_add)
    to = p.add_mutually_exclusive_group(required=True)
    to.add_argument("--webhook", metavar="URL", help="POST a JSON body to URL")
    to.add_argument("--email", nargs="?", const="", metavar="ADDRESS", help="send an email (default: your "
                                                                           "account's address)")
    p.add_argument("--slack", action="store_true", help="with --webhook: a Slack-compatible body")
    p.add_argument("--on", action="append", required=True, metavar="EVENTS",
                   help="comma-separated: " + ", ".join(EVENTS) + " (repeatable)")
    p = notify.add_parser("list", parents=[common], help="your subscriptions")
    p.set_defaults(func=cmd_notify_list)
    p = notify.add_parser("rm", parents=[common], help="end subscriptions")
    p.set_defaults(func=cmd_notify_rm)
    p.add_argument("ids", type=int, nargs="+", metavar="ID")

    p = add("exec", cmd_exec, "run a command inside a running job's replica (-- CMD ARGS...); -it: a shell")
    p.add_argument("id", type=int)
    p.add_argument("--rank", type=int, default=0, metavar="N", help="replica rank (default 0)")
    p.add_argument("-i", "--stdin", action="store_true", help="send this terminal's input to the command")
    p.add_argument("-t", "--tty", action="store_true", help="give the command a terminal (-it: a shell when no "
                                                            "command is given)")
    p = add("shell", cmd_shell, "an interactive shell inside a running job's replica")
    p.add_argument("id", type=int)
    p.add_argument("--rank", type=int, default=0, metavar="N", help="replica rank (default 0)")

    p = add("port-forward", cmd_port_forward, "forward a local port to a port a running job declares")
    p.add_argument("id", type=int)
    p.add_argument("ports", metavar="LOCAL:REMOTE", help="e.g. 8888:8888 (LOCAL 0: any free port)")
    p.add_argument("--rank", type=int, default=0, metavar="N", help="replica rank (default 0)")

    p = add("queue", cmd_queue, "a group's queue in order, with reasons")
    p.add_argument("group")
    p.add_argument("--limit", type=int, default=None)
    p = add("groups", cmd_groups, "your groups with quotas and usage; or one group")
    p.add_argument("name", nargs="?")
    add("util", cmd_util, "cluster utilisation: GPUs per node, running and queued per user")
    p = add("usage", cmd_usage, "GPU-hours per day, group and user")
    p.add_argument("--since", help="first day, YYYY-MM-DD (default 30 days ago)")
    p.add_argument("--until", help="last day, YYYY-MM-DD (default today)")
    p.add_argument("-g", "--group")
    p.add_argument("-u", "--user")
    return parser
