#!/usr/bin/env bash
# The production topology on this machine: PostgreSQL and Redis, the ASGI web server, the scheduler process
# (leader election, passes, backend sync, housekeeping: the only process that talks to the backend; /healthz,
# /readyz and /metrics on JOBSITE_SCHEDULER_HTTP_PORT) and a Celery worker with beat (database clocks), all from one
# code base and one settings module, configured by environment variables. Ctrl-C stops all of them.
#
#   make prod                        # PORT=8000, database jobsite_prod, Redis db 1, local backend, 2 web processes
#   JOBSITE_WEB_WORKERS=4 make prod  # web processes behind the one port
#   DATABASE_URL=... REDIS_URL=... JOBSITE_BACKEND=kubernetes make prod
#
# Without DATABASE_URL / REDIS_URL it uses this machine's PostgreSQL and Redis through credentials of the
# installation's own (jobsite/provision.py, kept beside secret-key in $JOBSITE_VAR_DIR, mode 0600): a PostgreSQL role
# that owns only its database (JOBSITE_PROD_DATABASE, default jobsite_prod) and a Redis ACL user limited to the
# installation's keys and channels (database JOBSITE_PROD_REDIS_DB, default 1). URLs you give are used as they are.
# Either way /metrics gets a bearer token ($JOBSITE_VAR_DIR/metrics-token unless JOBSITE_METRICS_TOKEN is set).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV_PY=.venv/bin/python
PORT="${PORT:-8000}"
export JOBSITE_BACKEND="${JOBSITE_BACKEND:-local}"
export JOBSITE_SCHEDULER_MODE=process
export JOBSITE_SCHEDULER_HTTP_PORT="${JOBSITE_SCHEDULER_HTTP_PORT:-$((PORT + 100))}"
export JOBSITE_VAR_DIR="${JOBSITE_VAR_DIR:-var/prod}"
mkdir -p "$JOBSITE_VAR_DIR"
PROD_DATABASE="${JOBSITE_PROD_DATABASE:-jobsite_prod}"
provision=(--var-dir "$JOBSITE_VAR_DIR" --database "$PROD_DATABASE")
[[ -n "${DATABASE_URL:-}" ]] || provision+=(--postgres-admin-url "postgres://postgres@127.0.0.1:5432/postgres")
[[ -n "${REDIS_URL:-}" ]] || provision+=(--redis-admin-url "redis://127.0.0.1:6379/${JOBSITE_PROD_REDIS_DB:-1}")
if [[ -z "${SECRET_KEY:-}" ]]; then  # one key per installation, kept with its data
    [[ -s "$JOBSITE_VAR_DIR/secret-key" ]] || (umask 077; "$VENV_PY" -c 'import secrets; print(secrets.token_urlsafe(50))' > "$JOBSITE_VAR_DIR/secret-key")
    SECRET_KEY="$(cat "$JOBSITE_VAR_DIR/secret-key")"
    export SECRET_KEY
fi

PG_DB="$(basename "${DATABASE_URL:-$PROD_DATABASE}" | sed 's/?.*//')" scripts/ensure-services.sh --no-browser
# The installation's credentials (and id, and metrics token) as `export NAME=value` lines; a failure stops here.
exports="$("$VENV_PY" -m jobsite.provision "${provision[@]}")"
eval "$exports"

"$VENV_PY" manage.py migrate --noinput
"$VENV_PY" manage.py collectstatic --noinput --verbosity 0
"$VENV_PY" manage.py seed_demo

pids=()
stop() {
    trap - INT TERM EXIT
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait || true
}
trap stop INT TERM EXIT

# JOBSITE_WEB_WORKERS web processes behind the one port (jobsite/serve_web.py), their /metrics added up from
# PROMETHEUS_MULTIPROC_DIR.
JOBSITE_WEB_WORKERS="${JOBSITE_WEB_WORKERS:-2}" PROMETHEUS_MULTIPROC_DIR="$JOBSITE_VAR_DIR/web-metrics" \
    "$VENV_PY" -m jobsite.serve_web --host 127.0.0.1 --port "$PORT" & pids+=($!)
"$VENV_PY" manage.py runscheduler & pids+=($!)
.venv/bin/celery -A jobsite worker --beat --loglevel INFO --concurrency 2 --without-gossip --without-mingle \
    --schedule "$JOBSITE_VAR_DIR/celerybeat-schedule" & pids+=($!)
echo "jobsite (production topology): http://127.0.0.1:$PORT/ — web, scheduler, worker+beat on PostgreSQL and Redis"
wait -n
echo "a jobsite process exited; stopping the others" >&2
exit 1
