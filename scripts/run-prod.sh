#!/usr/bin/env bash
# The production topology on this machine: PostgreSQL and Redis, the ASGI web server, the scheduler process
# (leader election, passes, backend sync, housekeeping: the only process that talks to the backend; /healthz,
# /readyz and /metrics on JOBSITE_SCHEDULER_HTTP_PORT) and a Celery worker with beat (database clocks), all from one
# code base and one settings module, configured by environment variables. Ctrl-C stops all of them.
#
#   make prod                        # PORT=8000, database jobsite_prod, Redis db 1, local backend
#   DATABASE_URL=... REDIS_URL=... JOBSITE_BACKEND=kubernetes make prod
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV_PY=.venv/bin/python
PORT="${PORT:-8000}"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/jobsite_prod}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/1}"
export JOBSITE_BACKEND="${JOBSITE_BACKEND:-local}"
export JOBSITE_SCHEDULER_MODE=process
export JOBSITE_SCHEDULER_HTTP_PORT="${JOBSITE_SCHEDULER_HTTP_PORT:-$((PORT + 100))}"
export JOBSITE_VAR_DIR="${JOBSITE_VAR_DIR:-var/prod}"
mkdir -p "$JOBSITE_VAR_DIR"
if [[ -z "${SECRET_KEY:-}" ]]; then  # one key per installation, kept with its data
    [[ -s "$JOBSITE_VAR_DIR/secret-key" ]] || (umask 077; "$VENV_PY" -c 'import secrets; print(secrets.token_urlsafe(50))' > "$JOBSITE_VAR_DIR/secret-key")
    SECRET_KEY="$(cat "$JOBSITE_VAR_DIR/secret-key")"
    export SECRET_KEY
fi

PG_DB="$(basename "${DATABASE_URL%%\?*}")" scripts/ensure-services.sh --no-browser

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

.venv/bin/uvicorn jobsite.asgi:application --host 127.0.0.1 --port "$PORT" --no-access-log \
    --ws-per-message-deflate false & pids+=($!)
"$VENV_PY" manage.py runscheduler & pids+=($!)
.venv/bin/celery -A jobsite worker --beat --loglevel INFO --concurrency 2 --without-gossip --without-mingle \
    --schedule "$JOBSITE_VAR_DIR/celerybeat-schedule" & pids+=($!)
echo "jobsite (production topology): http://127.0.0.1:$PORT/ — web, scheduler, worker+beat on PostgreSQL and Redis"
wait -n
echo "a jobsite process exited; stopping the others" >&2
exit 1
