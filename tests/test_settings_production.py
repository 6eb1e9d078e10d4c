"""Production refuses to start without a real SECRET_KEY; the embedded default (`make run`) needs none."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REAL_KEY = "k" * 20 + "-a-real-random-secret-key-for-tests"
PRINT_KEY = "from django.conf import settings; print(settings.SECRET_KEY)"


def load_settings(code: str = PRINT_KEY, **env_vars: str) -> subprocess.CompletedProcess:
    """Import jobsite.settings in a fresh process, outside pytest (no PYTEST_VERSION), with only these variables."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "PYTEST_VERSION")}
    env.update(DJANGO_SETTINGS_MODULE="jobsite.settings", **env_vars)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_embedded_default_starts_with_nothing_set():
    result = load_settings()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "embedded-default-not-for-production"


@pytest.mark.parametrize("production", [
    {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/jobsite_unused"},
    {"REDIS_URL": "redis://127.0.0.1:6379/9"},
])
@pytest.mark.parametrize("key", [None, "", "embedded-default-not-for-production", "too-short"])
def test_production_refuses_a_missing_public_or_short_key(production, key):
    extra = {} if key is None else {"SECRET_KEY": key}
    result = load_settings(**production, **extra)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "SECRET_KEY must be set" in result.stderr


def test_production_starts_with_a_real_key():
    result = load_settings(DATABASE_URL="postgres://postgres@127.0.0.1:5432/jobsite_unused",
                           REDIS_URL="redis://127.0.0.1:6379/9", SECRET_KEY=REAL_KEY)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == REAL_KEY


def test_debug_on_redis_is_development_and_keeps_the_embedded_key():
    result = load_settings(REDIS_URL="redis://127.0.0.1:6379/9", DEBUG="true")
    assert result.returncode == 0, result.stderr


def test_under_pytest_production_settings_get_a_throwaway_key_not_the_public_one():
    result = load_settings(REDIS_URL="redis://127.0.0.1:6379/9", PYTEST_VERSION="9")
    assert result.returncode == 0, result.stderr
    key = result.stdout.strip()
    assert key != "embedded-default-not-for-production" and len(key) >= 32



PRINT_PREFIXES = ("from django.conf import settings as s; print(s.JOBSITE_INSTALLATION_ID, "
                  "s.CHANNEL_LAYERS['default']['CONFIG']['prefix'], "
                  "s.CELERY_BROKER_TRANSPORT_OPTIONS['global_keyprefix'], s.CACHES['default']['KEY_PREFIX'])")
PRODUCTION = {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/jobsite_unused", "REDIS_URL": "redis://127.0.0.1:6379/9"}


def test_every_redis_name_carries_the_installation_id():
    seen = set()
    for key in (REAL_KEY, REAL_KEY[::-1]):
        result = load_settings(PRINT_PREFIXES, SECRET_KEY=key, **PRODUCTION)
        assert result.returncode == 0, result.stderr
        installation, layer, celery, cache = result.stdout.split()
        assert (layer, celery, cache) == (f"jobsite:{installation}:ws:", f"jobsite:{installation}:celery:",
                                          f"jobsite:{installation}:cache")
        seen.add(installation)
    assert len(seen) == 2  # derived from SECRET_KEY: two installations, two prefixes
    result = load_settings(PRINT_PREFIXES, SECRET_KEY=REAL_KEY, JOBSITE_INSTALLATION_ID="site-a", **PRODUCTION)
    assert result.stdout.split()[:2] == ["site-a", "jobsite:site-a:ws:"]


def test_an_installation_id_that_cannot_be_a_redis_prefix_is_refused():
    result = load_settings(SECRET_KEY=REAL_KEY, JOBSITE_INSTALLATION_ID="a:b*", **PRODUCTION)
    assert result.returncode != 0 and "JOBSITE_INSTALLATION_ID" in result.stderr
