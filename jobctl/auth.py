"""The commands that log in and out: `jobctl login` saves a token, `jobctl logout` revokes and forgets it."""

from __future__ import annotations

import getpass
import sys

from . import config
from .client import Api, ApiError, ConnectError
from .exits import EXIT_OK, UsageError
from .output import Printer


def cmd_login(api: Api, args, out: Printer) -> int:
    username = args.username or input("Username: ").strip()
    password = args.password if args.password is not None else getpass.getpass("Password: ")
    if not username:
        raise UsageError("a username is needed")
    reply = api.request("POST", "/api/v1/auth/token/", json_body={"username": username, "password": password})
    token = reply.json()["token"]
    data = config.load()
    data.setdefault("servers", {})[api.server] = {"username": username, "token": token}
    data["current"] = api.server
    path = config.save(data)
    print(f"Logged in to {api.server} as {username} (token saved in {path}).", file=sys.stderr)
    return EXIT_OK


def cmd_logout(api: Api, args, out: Printer) -> int:
    data = config.load()
    revoked = ""
    if api.token:
        # Revoke the token on the server too, so a copy of the config file is of no use. The local copy is forgotten
        # whatever the server says (already expired or revoked: 401; unreachable: said, and forgotten anyway).
        try:
            api.request("DELETE", "/api/v1/auth/token/")
            revoked = " (token revoked)"
        except ApiError as exc:
            if exc.status != 401:
                print(f"jobctl: the server did not revoke the token: {exc}", file=sys.stderr)
        except ConnectError as exc:
            print(f"jobctl: the token was not revoked: {exc}", file=sys.stderr)
    if (data.get("servers") or {}).pop(api.server, None) is not None:
        config.save(data)
        print(f"Logged out of {api.server}{revoked}.", file=sys.stderr)
    else:
        print(f"Not logged in to {api.server}.", file=sys.stderr)
    return EXIT_OK
