"""Where jobctl keeps its tokens: $XDG_CONFIG_HOME/jobctl/config.json (else ~/.config/jobctl/config.json), 0600.

    {"current": "http://127.0.0.1:8000", "servers": {"http://127.0.0.1:8000": {"username": "bob", "token": "..."}}}
"""

from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT_SERVER = "http://127.0.0.1:8000"


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".config"
    return root / "jobctl"


def config_path() -> Path:
    return config_dir() / "config.json"


def load() -> dict:
    try:
        data = json.loads(config_path().read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except (OSError, ValueError):
        return {}  # unreadable or corrupt: as if logged out; the next login rewrites it
    return data if isinstance(data, dict) else {}


def save(data: dict) -> Path:
    """Write the config readable by its owner only (the directory 0700, the file 0600), atomically."""
    directory = config_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = config_path()
    tmp = directory / f".config.json.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path


def normalise_server(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url


def resolve_server(flag: str | None, data: dict) -> str:
    """--server, then $JOBSITE_URL, then the server of the last login, then the local default."""
    return normalise_server(flag or os.environ.get("JOBSITE_URL") or data.get("current") or DEFAULT_SERVER)


def token_for(server: str, data: dict) -> str | None:
    entry = (data.get("servers") or {}).get(server) or {}
    token = entry.get("token")
    return token if isinstance(token, str) and token else None
