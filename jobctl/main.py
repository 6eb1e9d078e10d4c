"""jobctl's entry point: read the command line, run the command, and turn what went wrong into an exit code.

jobctl submits, follows and manages jobsite GPU jobs from a terminal. Every command talks to the REST API of one
jobsite server (``--server``, else ``$JOBSITE_URL``, else the server of the last ``jobctl login``, else
http://127.0.0.1:8000) with the token ``jobctl login`` saved.
"""

from __future__ import annotations

import os
import sys

from . import config
from .client import Api, ApiError, ConnectError
from .exits import EXIT_API_ERROR, EXIT_CONNECT, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, UsageError
from .output import Printer, color_enabled
from .parser import build_parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `jobctl submit [flags] -- COMMAND ARGS...`: everything after the first -- is the job's command (exec: the
# command to run in the job).
    command: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    args = parser.parse_args(argv)
    if command and args.cmd not in ("submit", "clone", "exec", "shell"):
        parser.error(f"{args.cmd} takes no command after --")
    args.argv = command
    data = config.load()
    server = config.resolve_server(args.server, data)
    api = Api(server, config.token_for(server, data))
    out = Printer(args.output, color_enabled(args.color))
    try:
        return args.func(api, args, out)
    except UsageError as exc:
        print(f"jobctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConnectError as exc:
        print(f"jobctl: {exc}", file=sys.stderr)
        return EXIT_CONNECT
    except ApiError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        if exc.status == 401 and args.cmd != "login":
            print(f"(not logged in to {server}? run: jobctl login --server {server})", file=sys.stderr)
        return EXIT_NOT_FOUND if exc.status == 404 else EXIT_API_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. jobctl logs 5 | head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
