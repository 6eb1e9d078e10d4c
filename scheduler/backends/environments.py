"""What an image means on the local backend: an environment of this machine (``Image.local_root``).

On a cluster an image is a container image; on one machine a lab keeps its software as directories instead, and an
admin names one per image. A job of that image sees it read-only in its sandbox with its ``bin`` first on ``PATH``:

  ``venv``    a Python virtual environment (``pyvenv.cfg``): also the interpreter it was made from (the ``home`` of
              ``pyvenv.cfg``: its ``bin/python`` is a link there), and ``VIRTUAL_ENV`` set, as ``activate`` would;
  ``prefix``  any other directory with a ``bin/`` (a conda environment: ``CONDA_PREFIX`` set, when it has
              ``conda-meta/``; a ``/opt/cuda-12`` tree);
  ``rootfs``  an unpacked root file system (``usr/bin`` and ``etc`` in it, e.g. ``docker export`` of an image): the
              sandbox shows it as its system in place of the machine's.

A directory reached through a link is shown under both names (a venv's scripts name the path it was made at).
``parse_pyvenv`` and ``kind_of`` are pure; ``read_environment`` looks at the directory.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass


class BadEnvironment(ValueError):
    """The image's environment is not a usable directory of this machine."""


@dataclass(frozen=True)
class Environment:
    root: str
    kind: str  # venv | prefix | rootfs
    shown: tuple[str, ...] = ()  # read-only in the sandbox (not for a rootfs: that is the system itself)
    bin: str = ""  # first on PATH
    variables: tuple[tuple[str, str], ...] = ()


def parse_pyvenv(text: str) -> dict[str, str]:
    """The ``key = value`` lines of a ``pyvenv.cfg``."""
    found = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found[key.strip().lower()] = value.strip()
    return found


def kind_of(names: set[str]) -> str:
    """The kind of an environment from what its root holds (``usr/bin`` meaning that directory exists)."""
    if "pyvenv.cfg" in names:
        return "venv"
    if {"usr/bin", "etc"} <= names and "bin/python" not in names:
        return "rootfs"
    return "prefix"


def read_environment(root: str) -> Environment:
    """The environment at ``root``; ``BadEnvironment`` when it is not a directory of this machine."""
    if not os.path.isdir(root):
        raise BadEnvironment(f"its environment {root} is not a directory of this machine")
    names = {n for n in ("pyvenv.cfg", "usr/bin", "etc", "bin/python", "conda-meta")
             if os.path.exists(os.path.join(root, n))}
    kind = kind_of(names)
    if kind == "rootfs":
        return Environment(root=root, kind=kind)
    real = os.path.realpath(root)
    shown = [root] if real == root else [root, real]
    variables: list[tuple[str, str]] = []
    if kind == "venv":
        with open(os.path.join(root, "pyvenv.cfg")) as f:
            home = parse_pyvenv(f.read()).get("home", "")
        if home:  # the interpreter's prefix: .../bin -> ...
            base = posixpath.dirname(os.path.realpath(home).rstrip("/")) or "/"
            if base not in ("/", "/usr") and not base.startswith("/usr/"):  # the system's is shown anyway
                shown.append(base)
        variables.append(("VIRTUAL_ENV", root))
    elif "conda-meta" in names:
        variables.append(("CONDA_PREFIX", root))
    return Environment(root=root, kind=kind, shown=tuple(shown), bin=os.path.join(root, "bin"),
                       variables=tuple(variables))
