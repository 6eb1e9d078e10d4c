"""`jobctl notify`: subscribe to events of your jobs by webhook or email (add), see your subscriptions (list) and
end one (rm)."""

from __future__ import annotations

import sys
from typing import Any

from .client import Api
from .exits import EXIT_OK, UsageError
from .output import Printer, age

PATH = "/api/v1/notifications/"
EVENTS = ("ended", "succeeded", "failed", "running", "idle_gpus")


def events_from_flags(values: list[str]) -> list[str]:
    """``--on ended,failed --on running`` → ["ended", "failed", "running"] (each once, in the order given)."""
    events: list[str] = []
    for value in values or []:
        for event in value.split(","):
            event = event.strip().lower()
            if not event:
                continue
            if event not in EVENTS:
                raise UsageError(f"--on {event!r}: events are {', '.join(EVENTS)}")
            if event not in events:
                events.append(event)
    if not events:
        raise UsageError(f"say which events with --on, e.g. --on ended,failed (of {', '.join(EVENTS)})")
    return events


def subscription_from_flags(args) -> dict[str, Any]:
    body: dict[str, Any] = {"events": events_from_flags(args.on)}
    if args.webhook:
        body.update(channel="webhook", url=args.webhook, slack=bool(args.slack))
    else:
        if args.slack:
            raise UsageError("--slack is a webhook's body: give it with --webhook URL")
        body.update(channel="email", email=args.email or "")
    return body


def _to(sub: dict) -> str:
    if sub["channel"] == "webhook":
        return sub.get("url") or "-"
    return sub.get("email") or "(your account's address)"


def _row(sub: dict) -> list[Any]:
    return [sub["id"], sub["channel"] + (" (slack)" if sub.get("slack") else ""), _to(sub),
            ",".join(sub.get("events") or []), age(sub.get("created_at"))]


HEADERS = ["ID", "CHANNEL", "TO", "EVENTS", "AGE"]


def cmd_notify_add(api: Api, args, out: Printer) -> int:
    sub = api.post(PATH, subscription_from_flags(args))
    if not out.data(sub):
        out.line(f"notification {sub['id']} added: {', '.join(sub['events'])} of your jobs by {sub['channel']} "
                 f"to {_to(sub)}")
    return EXIT_OK


def cmd_notify_list(api: Api, args, out: Printer) -> int:
    subs = list(api.pages(PATH))
    if out.data(subs):
        return EXIT_OK
    if not subs:
        print("No notifications. Add one: jobctl notify add --webhook URL --on ended", file=sys.stderr)
        return EXIT_OK
    out.table(HEADERS, [_row(s) for s in subs], max_width=80)
    return EXIT_OK


def cmd_notify_rm(api: Api, args, out: Printer) -> int:
    for sub_id in args.ids:
        api.request("DELETE", f"{PATH}{sub_id}/")
        if out.fmt == "table":
            out.line(f"notification {sub_id} removed")
    out.data({"removed": args.ids})
    return EXIT_OK
