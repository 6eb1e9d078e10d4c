"""The embedded server of `make run`, shared by a test module."""

import pytest

from .servers import make_server


@pytest.fixture(scope="module")
def embedded_server(tmp_path_factory):
    var_dir = tmp_path_factory.mktemp("embedded") / "var"
    with make_server("run", var_dir) as base:
        yield base
    assert (var_dir / "jobsite.sqlite3").exists()  # SQLite, no other service
