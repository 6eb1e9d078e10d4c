# Production image for jobsite.
#
# One image, three roles (pick with the container command):
#   web        (default CMD)  python -m jobsite.serve_web: uvicorn with $JOBSITE_WEB_WORKERS processes on 0.0.0.0:8000
#   scheduler                 python manage.py runscheduler   (run two: leader election keeps one active;
#                                                             /healthz, /readyz, /metrics on port 9100)
#   worker                    celery -A jobsite worker -B      (database clocks only; no cluster access)
#
# Configuration comes from the environment, for example:
#   SECRET_KEY      required; the embedded default is not for production
#   DATABASE_URL    postgres://user:password@host:5432/jobsite (the SQLite default is for `make run` only)
#   REDIS_URL       redis://host:6379/0 (channel layer and Celery broker; also selects the scheduler's own process)
#   ALLOWED_HOSTS   comma-separated host names, CSRF_TRUSTED_ORIGINS as needed
#   JOBSITE_BACKEND e.g. kubernetes
# Run `python manage.py migrate --noinput` once per release before the web and scheduler roles start (deploy/ does
# it in the scheduler's init container).
#
# Static files are collected into /app/var/staticfiles at build time and served by WhiteNoise. Do not mount a
# volume over /app/var (or point JOBSITE_VAR_DIR elsewhere) without collecting static files there again.
#
# There is no HEALTHCHECK, as the three roles are probed differently: the orchestrator probes web's /healthz (port
# 8000), the scheduler's /healthz and /readyz (port 9100) and the worker with `celery inspect ping`.

# The browser's terminal (xterm.js) from its npm packages, pinned by package-lock.json; served as static files.
FROM node:20-slim AS node-packages
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    JOBSITE_VAR_DIR=/app/var \
    PORT=8000

WORKDIR /app

RUN groupadd --system --gid 10001 jobsite \
    && useradd --system --uid 10001 --gid jobsite --home-dir /app --no-create-home --shell /usr/sbin/nologin jobsite

# Dependencies first, so code changes do not invalidate this layer. All pinned packages ship manylinux wheels
# (psycopg[binary] bundles libpq), so no compiler or system libraries are needed.
COPY requirements.txt ./
RUN pip install -r requirements.txt

# Code stays owned by root (read-only for the app); only var/ is writable by the jobsite user.
COPY . .
COPY --from=node-packages /app/node_modules ./node_modules
RUN mkdir -p /app/var && chown jobsite:jobsite /app/var

USER jobsite

# The key only lets settings load during the build; it is not kept in the image.
RUN SECRET_KEY=collectstatic-build-only python manage.py collectstatic --noinput

EXPOSE 8000

# uvicorn serving jobsite.asgi:application with JOBSITE_WEB_WORKERS processes (default 1) and their /metrics added up
# (jobsite/serve_web.py); no per-message compression of WebSocket frames: the live pages send the same small
# fragments to many sockets, encoded once (jobs/live_list.py).
CMD ["python", "-m", "jobsite.serve_web", "--host", "0.0.0.0", "--port", "8000"]
