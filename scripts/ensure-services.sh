#!/usr/bin/env bash
# Make sure the services the test suite needs are up:
#   - PostgreSQL on $PG_HOST:$PG_PORT (trust auth for $PG_USER) with database $PG_DB,
#   - Redis on $REDIS_HOST:$REDIS_PORT,
#   - Chromium at $CHROMIUM_BIN, bubblewrap's bwrap and slirp4netns (the job sandbox and its outbound network),
#     installed from Debian with apt-get when missing; npm likewise (`--npm-only`: that alone).
# Anything already running is left alone, so the script is idempotent and quick when all is up.
# It exits non-zero with a message as soon as something cannot be started.
set -euo pipefail

PG_HOST="${PG_HOST:-127.0.0.1}"
PG_PORT="${PG_PORT:-5432}"
PG_USER="${PG_USER:-postgres}"
PG_DB="${PG_DB:-jobsite}"
REDIS_HOST="${REDIS_HOST:-127.0.0.1}"
REDIS_PORT="${REDIS_PORT:-6379}"
CHROMIUM_BIN="${CHROMIUM_BIN:-/usr/bin/chromium}"
WAIT_SECONDS="${WAIT_SECONDS:-30}"

log() { printf 'ensure-services: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# wait_for DESCRIPTION COMMAND...: retry COMMAND every half second for up to $WAIT_SECONDS.
wait_for() {
    local what="$1"; shift
    local tries=$((WAIT_SECONDS * 2))
    while ((tries-- > 0)); do
        if "$@" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.5
    done
    die "$what did not come up within ${WAIT_SECONDS}s"
}

need() {
    command -v "$1" >/dev/null 2>&1 || die "'$1' not found; $2"
}

# --- PostgreSQL ------------------------------------------------------------------------------------------
pg_ready() { pg_isready -q -h "$PG_HOST" -p "$PG_PORT"; }
pg_query() { psql -X -q -t -A -v ON_ERROR_STOP=1 -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d postgres -c "$1"; }

ensure_postgres() {
    need pg_isready "install the postgresql-client package"
    need psql "install the postgresql-client package"
    if pg_ready; then
        log "PostgreSQL is up on $PG_HOST:$PG_PORT"
    else
        need pg_ctlcluster "install the postgresql package"
        local version
        # The newest installed cluster version (normally just one, e.g. 15).
        version="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)"
        [[ -n "$version" ]] || die "no PostgreSQL cluster under /etc/postgresql"
        log "starting PostgreSQL $version/main"
        if ! pg_ctlcluster --skip-systemctl-redirect "$version" main start; then
            tail -n 20 "/var/log/postgresql/postgresql-$version-main.log" >&2 2>/dev/null || true
            die "pg_ctlcluster could not start PostgreSQL $version/main (or it runs but not on $PG_HOST:$PG_PORT)"
        fi
        wait_for "PostgreSQL on $PG_HOST:$PG_PORT" pg_ready
        log "PostgreSQL started"
    fi

    pg_query "SELECT 1" >/dev/null || die "cannot connect to PostgreSQL as '$PG_USER' on $PG_HOST:$PG_PORT"
    if [[ "$(pg_query "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" != "1" ]]; then
        log "creating database $PG_DB"
        pg_query "CREATE DATABASE \"$PG_DB\"" || die "cannot create database $PG_DB"
    fi
}

# --- Redis -----------------------------------------------------------------------------------------------
redis_ready() { [[ "$(redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null)" == "PONG" ]]; }

ensure_redis() {
    need redis-cli "install the redis-tools package"
    if redis_ready; then
        log "Redis is up on $REDIS_HOST:$REDIS_PORT"
        return 0
    fi
    need redis-server "install the redis-server package"
    log "starting Redis on $REDIS_HOST:$REDIS_PORT"
    redis-server --daemonize yes --bind "$REDIS_HOST" --port "$REDIS_PORT" --save "" --appendonly no \
        || die "redis-server could not start"
    wait_for "Redis on $REDIS_HOST:$REDIS_PORT" redis_ready
    log "Redis started"
}

# --- Debian packages: Chromium (browser tests), bubblewrap and slirp4netns (the local backend's job sandbox) --
# apt_install PACKAGE...: install the packages with apt-get (root only), one `apt-get update` per run.
APT_UPDATED=0
apt_install() {
    [[ "$(id -u)" -eq 0 ]] || die "missing $*; install as root: apt-get install -y $*"
    export DEBIAN_FRONTEND=noninteractive
    if ((APT_UPDATED == 0)); then
        apt-get update -q || die "apt-get update failed"
        APT_UPDATED=1
    fi
    log "installing $* with apt-get"
    apt-get install -y -q "$@" || die "apt-get install $* failed"
}

ensure_chromium() {
    if [[ ! -x "$CHROMIUM_BIN" ]]; then
        [[ "$CHROMIUM_BIN" == /usr/bin/chromium ]] || die "$CHROMIUM_BIN not found"
        apt_install chromium
        [[ -x "$CHROMIUM_BIN" ]] || die "chromium installed but $CHROMIUM_BIN is missing"
    fi
    local version
    version="$("$CHROMIUM_BIN" --version 2>/dev/null)" || die "$CHROMIUM_BIN does not run"
    log "Chromium is available: $version"
}

ensure_bubblewrap() {
    local missing=()
    command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
    command -v slirp4netns >/dev/null 2>&1 || missing+=(slirp4netns)
    command -v ip >/dev/null 2>&1 || missing+=(iproute2)
    ((${#missing[@]} == 0)) || apt_install "${missing[@]}"
    log "bubblewrap is available: $(bwrap --version 2>/dev/null); $(slirp4netns --version 2>/dev/null | head -n 1)"
}

# npm installs the browser's packages of package.json (xterm.js for a job's terminal); Debian's nodejs brings it.
ensure_npm() {
    command -v npm >/dev/null 2>&1 || apt_install npm
    log "npm is available: $(npm --version 2>/dev/null)"
}

if [[ "${1:-}" == "--npm-only" ]]; then
    ensure_npm
    exit 0
fi
ensure_postgres
ensure_redis
ensure_bubblewrap
ensure_npm
[[ "${1:-}" == "--no-browser" ]] || ensure_chromium
