"""jobsite settings, read from environment variables (twelve-factor).

The embedded default needs none of them: SQLite under var/, the in-memory channel layer, the local backend and
the scheduler running inside the web process. Production sets DATABASE_URL, REDIS_URL, SECRET_KEY and so on.
"""

import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(environ.Env().str("JOBSITE_VAR_DIR", default=str(BASE_DIR / "var")))

env = environ.Env(
    DEBUG=(bool, False),
    ALLOWED_HOSTS=(list, ["127.0.0.1", "localhost", "[::1]", "testserver"]),
    JOBSITE_BACKEND=(str, "local"),
)

# Checked in the security section at the end, once the database and Redis settings tell embedded from production.
SECRET_KEY = env.str("SECRET_KEY", default="")
DEBUG = env("DEBUG")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
PORT = env.int("PORT", default=8000)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "channels",
    "jobs",
    "scheduler",
]

MIDDLEWARE = [
    "jobs.health.ProbeMiddleware",  # probes and scrapers call the pod IP over HTTP: before the host and HTTPS checks
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "jobsite.security.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "jobsite.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "jobsite.wsgi.application"
ASGI_APPLICATION = "jobsite.asgi.application"

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'jobsite.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The embedded default runs the web server and the scheduler in one process: WAL lets readers go on while one
    # writer commits, IMMEDIATE transactions take the write lock up front instead of failing on upgrade, and the
    # process's writers queue on a lock of their own first (jobsite.sqlite3), not on SQLite's sleeping retries.
    DATABASES["default"]["ENGINE"] = "jobsite.sqlite3"
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 30, "transaction_mode": "IMMEDIATE",
         "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"}
    )
else:
    # A pool per process (psycopg_pool): under ASGI every sync-to-async thread kept its own connection, so one web
    # process could exhaust max_connections. A process holds at most JOBSITE_DB_POOL_MAX connections; a request
    # waits up to JOBSITE_DB_POOL_TIMEOUT s for one. JOBSITE_DB_POOL=false: a connection per thread (CONN_MAX_AGE),
    # e.g. behind an external pooler. The pool checks a connection before handing it out (JOBSITE_DB_POOL_CHECK)
    # and replaces one the server ended; one found dead sweeps the others (jobsite.dbpool).
    if env.bool("JOBSITE_DB_POOL", default=True):
        DATABASES["default"].update(  # the pool requires CONN_MAX_AGE=0
            ENGINE="jobsite.postgresql", CONN_MAX_AGE=0,
            CONN_HEALTH_CHECKS=env.bool("JOBSITE_DB_POOL_CHECK", default=True))
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": env.int("JOBSITE_DB_POOL_MIN", default=1),
            "max_size": env.int("JOBSITE_DB_POOL_MAX", default=10),
            "timeout": env.float("JOBSITE_DB_POOL_TIMEOUT", default=30.0),
            "max_idle": 300.0,
        }
    else:
        DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
    # Parameters bound by the server, so psycopg prepares a query run 5 times on a connection and PostgreSQL stops
    # planning it again (1-2 ms a plan for the queue's reads). Off behind a pooler in transaction mode.
    if env.bool("JOBSITE_DB_PREPARE", default=True):
        DATABASES["default"].setdefault("OPTIONS", {}).update(server_side_binding=True, prepare_threshold=5)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Failed logins are counted per username and client address (jobs.api.auth); this backend refuses a locked one.
AUTHENTICATION_BACKENDS = ["jobs.api.auth.LockingModelBackend"]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "jobs:list"
LOGOUT_REDIRECT_URL = "login"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "jobs.api.auth.ExpiringTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "jobs.api.pagination.JobPagination",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "PAGE_SIZE": 50,
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "EXCEPTION_HANDLER": "jobs.api.exceptions.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "jobs.api.schema.AutoSchema",
}

REDIS_URL = env.str("REDIS_URL", default="")

CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True

# --- jobsite -----------------------------------------------------------------------------------------------
JOBSITE_BACKEND = env("JOBSITE_BACKEND")
# "inprocess": the scheduler loop runs in a thread of the web process (embedded default);
# "process": the loop is `manage.py runscheduler`, its own process (production); web processes wake it with a
# PostgreSQL NOTIFY after commit and never talk to the cluster themselves.
JOBSITE_SCHEDULER_MODE = env.str("JOBSITE_SCHEDULER_MODE", default="process" if REDIS_URL else "inprocess")
JOBSITE_SCHEDULER_INTERVAL = env.float("JOBSITE_SCHEDULER_INTERVAL", default=1.0)
JOBSITE_LOCAL_ROOT = Path(env.str("JOBSITE_LOCAL_ROOT", default=str(VAR_DIR / "local")))
# Virtual GPUs of the local node when nvidia-smi finds none (so the demo can run GPU jobs).
JOBSITE_LOCAL_GPUS = env.int("JOBSITE_LOCAL_GPUS", default=8)
JOBSITE_LOCAL_USE_NVIDIA_SMI = env.bool("JOBSITE_LOCAL_USE_NVIDIA_SMI", default=True)
JOBSITE_LOCAL_NODE = env.str("JOBSITE_LOCAL_NODE", default="local")
# Seconds a launched replica's supervisor may take to start (write its pid); past it the replica is lost.
JOBSITE_LOCAL_START_TIMEOUT_SECONDS = env.int("JOBSITE_LOCAL_START_TIMEOUT_SECONDS", default=60)
# Job isolation on the local backend (README "Job isolation"): "auto" (bubblewrap when installed, else unsandboxed
# with a warning), "bwrap" (required: the scheduler refuses to start without it) or "off" (unsandboxed).
JOBSITE_LOCAL_SANDBOX = env.str("JOBSITE_LOCAL_SANDBOX", default="auto")
# The unprivileged user and group sandboxed job processes run as.
JOBSITE_LOCAL_SANDBOX_UID = env.int("JOBSITE_LOCAL_SANDBOX_UID", default=65534)
JOBSITE_LOCAL_SANDBOX_GID = env.int("JOBSITE_LOCAL_SANDBOX_GID", default=65534)
# Paths every sandboxed job sees read-only besides the system (software, datasets); comma-separated.
JOBSITE_LOCAL_SANDBOX_PATHS = env.list("JOBSITE_LOCAL_SANDBOX_PATHS", default=[str(BASE_DIR / "examples")])
# What a sandboxed job's network reaches besides its attempt's own loopback (scheduler/backends/netns.py):
# "outbound" (the internet through slirp4netns; no address of this machine) or "none" (loopback only).
JOBSITE_LOCAL_JOB_NETWORK = env.str("JOBSITE_LOCAL_JOB_NETWORK", default="outbound")
# Where the NVIDIA device nodes are (a replica sees only those of its own GPUs and the control devices).
JOBSITE_LOCAL_DEVICE_DIR = env.str("JOBSITE_LOCAL_DEVICE_DIR", default="/dev")
# A sandbox's /dev/shm holds at most this share of the replica's memory; /tmp and /var/tmp at most all of it
# (memory-backed, they count against the replica's memory limit too).
JOBSITE_LOCAL_SHM_FRACTION = env.float("JOBSITE_LOCAL_SHM_FRACTION", default=0.5)
# Resource limits of each local replica (README "Resource limits", scheduler/backends/limits.py): its instance type's
# memory (no swap) and CPU through a cgroup of its own. "auto" (each cgroup controller this machine allows, and a
# warning naming the others), "require" (the scheduler refuses to start while one is missing) or "off".
JOBSITE_LOCAL_LIMITS = env.str("JOBSITE_LOCAL_LIMITS", default="auto")
# Processes and threads of one replica (cgroup pids.max): enough for torchrun and DataLoader workers; 0: no limit.
JOBSITE_LOCAL_PIDS_MAX = env.int("JOBSITE_LOCAL_PIDS_MAX", default=8192)
# Bytes a replica's working directory may hold (0: no bound): no file may grow past it (RLIMIT_FSIZE) and the
# supervisor measures the directory every DISK_CHECK_SECONDS, killing the replica once it is over (reason Evicted).
JOBSITE_LOCAL_DISK_BYTES = env.int("JOBSITE_LOCAL_DISK_BYTES", default=50 * 1024**3)
JOBSITE_LOCAL_DISK_CHECK_SECONDS = env.float("JOBSITE_LOCAL_DISK_CHECK_SECONDS", default=10.0)
# A cgroup v2 directory this server may manage (a delegated subtree) to put the replicas' cgroups under; empty: found.
JOBSITE_LOCAL_CGROUP_PARENT = env.str("JOBSITE_LOCAL_CGROUP_PARENT", default="")
# Seconds between SIGTERM and SIGKILL when a job is cancelled.
JOBSITE_TERMINATION_GRACE_SECONDS = env.int("JOBSITE_TERMINATION_GRACE_SECONDS", default=10)
JOBSITE_DEFAULT_ACTIVE_DEADLINE_SECONDS = env.int("JOBSITE_DEFAULT_ACTIVE_DEADLINE_SECONDS", default=86400)
JOBSITE_DEFAULT_INTERACTIVE_DEADLINE_SECONDS = env.int(
    "JOBSITE_DEFAULT_INTERACTIVE_DEADLINE_SECONDS", default=12 * 3600
)
# An attempt still preparing after this long is requeued (backoff 60 s doubling to 1 h), at most REQUEUE_LIMIT times.
JOBSITE_PREPARING_TIMEOUT_SECONDS = env.int("JOBSITE_PREPARING_TIMEOUT_SECONDS", default=180)
JOBSITE_REQUEUE_LIMIT = env.int("JOBSITE_REQUEUE_LIMIT", default=5)
JOBSITE_DEFAULT_TTL_SECONDS_AFTER_FINISHED = env.int("JOBSITE_DEFAULT_TTL_SECONDS_AFTER_FINISHED", default=7 * 86400)
JOBSITE_DEFAULT_BACKOFF_LIMIT = env.int("JOBSITE_DEFAULT_BACKOFF_LIMIT", default=6)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
}
# Seconds a replica may stay unreachable before its attempt fails as NodeLost and the job is retried.
JOBSITE_NODE_LOST_GRACE_SECONDS = env.int("JOBSITE_NODE_LOST_GRACE_SECONDS", default=300)

# --- control plane: one active scheduler ---------------------------------------------------------------------
# Leader election: "lease" (a coordination.k8s.io Lease, the default with the kubernetes backend), "advisory" (a
# PostgreSQL advisory lock, the default on PostgreSQL otherwise) or "none" (SQLite: the single embedded process).
JOBSITE_LEADER_ELECTION = env.str("JOBSITE_LEADER_ELECTION", default="")
JOBSITE_LEADER_LEASE_NAME = env.str("JOBSITE_LEADER_LEASE_NAME", default="jobsite-scheduler")
# Namespace of the Lease: the scheduler's own (POD_NAMESPACE from the downward API), else the jobs' namespace.
JOBSITE_LEADER_NAMESPACE = env.str("JOBSITE_LEADER_NAMESPACE", default=env.str("POD_NAMESPACE", default=""))
# Kubernetes' controllers' 15/10/2: a leader not renewed for LEASE_SECONDS is replaced (within LEASE + 2 × RETRY: 19 s);
# it renews (standbys retry) every RETRY_SECONDS; one that could not renew for RENEW_DEADLINE_SECONDS (< LEASE) steps
# down and refuses every cluster-changing action from then on (scheduler.leader.fence).
JOBSITE_LEADER_LEASE_SECONDS = env.float("JOBSITE_LEADER_LEASE_SECONDS", default=15.0)
JOBSITE_LEADER_RENEW_DEADLINE_SECONDS = env.float("JOBSITE_LEADER_RENEW_DEADLINE_SECONDS", default=10.0)
JOBSITE_LEADER_RETRY_SECONDS = env.float("JOBSITE_LEADER_RETRY_SECONDS", default=2.0)
# The scheduler process serves /healthz, /readyz and /metrics on this port (0: off).
JOBSITE_SCHEDULER_HTTP_PORT = env.int("JOBSITE_SCHEDULER_HTTP_PORT", default=9100)
# /metrics of the web process and of the scheduler's HTTP port (jobsite.security.metrics_refusal): when set, a scraper
# must send `Authorization: Bearer <token>` (staff sessions may always read the web's). When empty, /metrics is
# refused in production (JOBSITE_PRODUCTION) unless JOBSITE_METRICS_PUBLIC opens it to anyone who can reach it;
# the embedded default leaves it open. `make prod` keeps a token in $JOBSITE_VAR_DIR/metrics-token.
JOBSITE_METRICS_TOKEN = env.str("JOBSITE_METRICS_TOKEN", default="")
JOBSITE_METRICS_PUBLIC = env.bool("JOBSITE_METRICS_PUBLIC", default=False)

# --- Kubernetes backend (JOBSITE_BACKEND=kubernetes) ---------------------------------------------------------
# The API server comes from KUBECONFIG (or ~/.kube/config), or the in-cluster service account when running in a pod.
JOBSITE_K8S_NAMESPACE = env.str("JOBSITE_K8S_NAMESPACE", default="jobsite")
# User and group ids job containers run as (runAsUser/runAsGroup, and runAsNonRoot): empty keeps the image's own
# user (many GPU images run as root), which the jobs namespace's Pod Security level must then allow (baseline).
JOBSITE_K8S_RUN_AS_USER = env.int("JOBSITE_K8S_RUN_AS_USER", default=None)
JOBSITE_K8S_RUN_AS_GROUP = env.int("JOBSITE_K8S_RUN_AS_GROUP", default=None)
# Size limit of each replica's working directory (an emptyDir at /home/jovyan).
JOBSITE_K8S_WORKDIR_SIZE = env.str("JOBSITE_K8S_WORKDIR_SIZE", default="5Gi")
# /dev/shm of each replica (a memory-backed emptyDir, counted against its memory limit): this fraction of the
# instance type's memory, in (0, 1], capped at JOBSITE_K8S_SHM_MAX (a quantity such as "16Gi"; empty: no cap).
JOBSITE_K8S_SHM_FRACTION = env.float("JOBSITE_K8S_SHM_FRACTION", default=0.5)
JOBSITE_K8S_SHM_MAX = env.str("JOBSITE_K8S_SHM_MAX", default="")
# Names of image pull secrets in the namespace, comma-separated.
JOBSITE_K8S_IMAGE_PULL_SECRETS = env.list("JOBSITE_K8S_IMAGE_PULL_SECRETS", default=[])
# Pod scheduling defaults as JSON; an instance type's nodeSelector/tolerations are merged over them.
JOBSITE_K8S_DEFAULT_NODE_SELECTOR = env.json("JOBSITE_K8S_DEFAULT_NODE_SELECTOR", default={})
JOBSITE_K8S_DEFAULT_TOLERATIONS = env.json("JOBSITE_K8S_DEFAULT_TOLERATIONS", default=[])
JOBSITE_K8S_DEFAULT_AFFINITY = env.json("JOBSITE_K8S_DEFAULT_AFFINITY", default={})
# Datasets mounted read-only at /datasets/<name>, as JSON: [{"name": "mnist", "volume": {<a pod volume source>},
# "groups": ["research"]}] ("groups" optional: every group when absent).
JOBSITE_K8S_DATASETS = env.json("JOBSITE_K8S_DATASETS", default=[])
# Feed the Ready nodes' allocatable GPU/CPU/memory to the admission check (needs `list nodes`, a ClusterRole).
JOBSITE_K8S_CHECK_CAPACITY = env.bool("JOBSITE_K8S_CHECK_CAPACITY", default=False)
# Gang start of multi-replica jobs (scheduler/backends/k8s_gang.py): "" (off: replicas are placed one by one and an
# attempt not wholly running within JOBSITE_PREPARING_TIMEOUT_SECONDS is requeued whole), "coscheduling" (a
# scheduling.x-k8s.io PodGroup, scheduler-plugins) or "volcano" (a scheduling.volcano.sh PodGroup). Needs the
# podgroups rights of deploy/components/gang-<mode>.
JOBSITE_K8S_GANG_SCHEDULING = env.str("JOBSITE_K8S_GANG_SCHEDULING", default="")
# spec.schedulerName of every job pod; empty: the cluster's default scheduler, or "volcano" with volcano above.
JOBSITE_K8S_SCHEDULER_NAME = env.str("JOBSITE_K8S_SCHEDULER_NAME", default="")
# A replica still failing to pull its image this long after its pod started fails the job as FailedImagePull.
JOBSITE_K8S_IMAGE_PULL_GRACE_SECONDS = env.int("JOBSITE_K8S_IMAGE_PULL_GRACE_SECONDS", default=120)
# Seconds between re-deliveries of the watched pods' cache (a full relist only after errors), between reads of the
# nodes (capacity checking), and between deletions of orphaned pods/services by the leader (logs archived first).
JOBSITE_K8S_RESYNC_SECONDS = env.float("JOBSITE_K8S_RESYNC_SECONDS", default=60.0)
# Server-side timeout of one watch request; the client gives up reading after this plus a margin.
JOBSITE_K8S_WATCH_TIMEOUT_SECONDS = env.int("JOBSITE_K8S_WATCH_TIMEOUT_SECONDS", default=300)
# Retries of a Kubernetes API call that failed with 5xx/429 or a network error, with doubling backoff.
JOBSITE_K8S_API_RETRIES = env.int("JOBSITE_K8S_API_RETRIES", default=5)
JOBSITE_K8S_API_RETRY_BASE_SECONDS = env.float("JOBSITE_K8S_API_RETRY_BASE_SECONDS", default=0.5)
# A running replica's archived log is refreshed from the pod log API at most this often (seconds).
JOBSITE_K8S_LOG_REFRESH_SECONDS = env.float("JOBSITE_K8S_LOG_REFRESH_SECONDS", default=5.0)
# Threads that copy new log bytes from the pod log API into the archive (never the admission thread).
JOBSITE_K8S_LOG_WORKERS = env.int("JOBSITE_K8S_LOG_WORKERS", default=8)
# Pod log API requests a second for running pods, all together, spaced evenly (0: no bound): rank 0 and pods that
# wrote lately first, the others in turn; archiving an ended pod's rest never waits but counts.
JOBSITE_K8S_LOG_REQUESTS_PER_SECOND = env.float("JOBSITE_K8S_LOG_REQUESTS_PER_SECOND", default=20.0)
# Pods deleted with the job's grace period are force-deleted (grace 0) only when their node is lost, or when they
# are still there this many seconds after their grace period ended (a kubelet that never confirms).
JOBSITE_K8S_STUCK_TERMINATION_SECONDS = env.int("JOBSITE_K8S_STUCK_TERMINATION_SECONDS", default=600)
# Times a job may be requeued because the cluster disrupted it (preemption by the cluster's scheduler, eviction,
# node pressure, a lost node, a GPU admission error) without spending its backoff; past it the job fails.
JOBSITE_K8S_MAX_DISRUPTIONS = env.int("JOBSITE_K8S_MAX_DISRUPTIONS", default=10)
# Pods carry JOBSITE_INSTALLATION_ID (below) as label and annotation jobsite/installation: installations sharing a
# namespace never adopt or delete each other's pods; changing it (or SECRET_KEY) while jobs run orphans their pods.
# GPUs' extended resource unless the instance type names its own (gpu_resource, e.g. nvidia.com/mig-1g.10gb).
JOBSITE_K8S_GPU_RESOURCE = env.str("JOBSITE_K8S_GPU_RESOURCE", default="nvidia.com/gpu")
# Pods' priorityClassName by job priority, JSON {"high": "jobs-high"}; unnamed: the cluster's default (must exist).
JOBSITE_K8S_PRIORITY_CLASSES = env.json("JOBSITE_K8S_PRIORITY_CLASSES", default={})
# Node disk (ephemeral-storage: container layer, logs, working directory) each replica requests, so the kubelet does
# not evict job pods first under disk pressure, and may use at most (evicted past it). E.g. "20Gi"; empty: none.
JOBSITE_K8S_EPHEMERAL_STORAGE_REQUEST = env.str("JOBSITE_K8S_EPHEMERAL_STORAGE_REQUEST", default="10Gi")
JOBSITE_K8S_EPHEMERAL_STORAGE_LIMIT = env.str("JOBSITE_K8S_EPHEMERAL_STORAGE_LIMIT", default="")
# Archived logs of every backend that keeps them outside its own root: <root>/job-<id>/attempt-<n>/replica-<r>.log
JOBSITE_LOG_ROOT = Path(env.str("JOBSITE_LOG_ROOT", default=str(VAR_DIR / "logs")))
# --- end of the Kubernetes backend settings -----------------------------------------------------------------

# --- live push (issue 4) ---------------------------------------------------------------------------------------
# Job changes reach browsers as small per-job messages on Channels groups (jobs.live_publisher). The embedded default
# keeps them in this process; production (REDIS_URL) shares them between web processes, workers and the scheduler.
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # Pub/sub: a change is one PUBLISH per audience, pushed to each web process's one subscriber (the
            # process's jobs.live_hub.Hub, which feeds its sockets from memory). No per-message round trips (the
            # list-based layer spent four per message received), and group memberships live in the processes:
            # a socket that goes, or a process that dies, leaves nothing behind in Redis. Live updates are
            # at-most-once by design: a page that reconnects is sent what changed (jobs.consumers).
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            # prefix: "jobsite:<installation id>:ws:", set in the security section once SECRET_KEY is settled.
            "CONFIG": {"hosts": [REDIS_URL], "prefix": "jobsite:ws:"},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 1000}}}
# Seconds between reads of a followed log file (the detail page's tail -f).
JOBSITE_LOG_FOLLOW_INTERVAL = env.float("JOBSITE_LOG_FOLLOW_INTERVAL", default=0.5)
# --- end of live push ------------------------------------------------------------------------------------------

# --- OpenAPI (issue 6) ---------------------------------------------------------------------------------------
# drf-spectacular serves the schema at /api/schema/ and Swagger UI at /api/docs/, with Swagger UI's files from the
# drf-spectacular-sidecar package (static files), so the docs work with no internet access.
SPECTACULAR_SETTINGS = {
    "TITLE": "jobsite API",
    "DESCRIPTION": (
        "Submit GPU jobs to your groups' queues, follow them and act on them.\n\n"
        "Authenticate with `Authorization: Token <token>` (POST /api/v1/auth/token/) or a browser session.\n\n"
        "**Errors** all have one shape: `{\"detail\": \"...\", \"errors\": {\"field.path\": [\"message\"]}}`. "
        "`detail` is one line for a person; `errors` names each invalid field of the body or query (empty when "
        "no field is to blame). Jobs and groups of groups you are not in answer 404."
    ),
    "VERSION": "1",
    "SCHEMA_PATH_PREFIX": r"/api/v[0-9]+",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "jobs.api.schema.optional_vocabulary_fields",
    ],
}
# --- end of OpenAPI (issue 6) ----------------------------------------------------------------------------------

# --- security (production hardening) ---------------------------------------------------------------------------
# Production is any setup on PostgreSQL or Redis without DEBUG; `make run` (SQLite, no Redis) is the embedded default.
EMBEDDED_SECRET_KEY = "embedded-default-not-for-production"
SECRET_KEY_MIN_LENGTH = 32
JOBSITE_PRODUCTION = not DEBUG and bool(REDIS_URL or DATABASES["default"]["ENGINE"] != "jobsite.sqlite3")
# The test suite runs on PostgreSQL and Redis like production; pytest sets PYTEST_VERSION for its session (and the
# processes it starts), which get a throwaway key of their own and a cache of their own (no login counts between runs).
JOBSITE_TESTING = bool(os.environ.get("PYTEST_VERSION"))
if not SECRET_KEY and JOBSITE_TESTING:
    SECRET_KEY = secrets.token_urlsafe(50)
if JOBSITE_PRODUCTION and (
    not SECRET_KEY or SECRET_KEY == EMBEDDED_SECRET_KEY or len(SECRET_KEY) < SECRET_KEY_MIN_LENGTH
):
    raise ImproperlyConfigured(
        "SECRET_KEY must be set to a secret random value of at least "
        f"{SECRET_KEY_MIN_LENGTH} characters in production (DATABASE_URL or REDIS_URL is set and DEBUG is off), "
        "e.g. SECRET_KEY=\"$(openssl rand -base64 48)\"; the embedded default key is public and refused."
    )
SECRET_KEY = SECRET_KEY or EMBEDDED_SECRET_KEY

# One installation among others on the same Redis (whose pub/sub ignores database numbers): its id prefixes every
# Redis key and channel jobsite uses ("jobsite:<id>:": the channel layer's channels, Celery's keys, the cache) and is
# part of every signed channel-layer message (jobs.channel_auth), so two installations never hear each other.
# Default: derived from SECRET_KEY; `make prod` keeps one per installation in $JOBSITE_VAR_DIR/installation-id (its
# Redis ACL user may touch only keys and channels under that prefix).
JOBSITE_INSTALLATION_ID = env.str("JOBSITE_INSTALLATION_ID", default="") or hmac.new(
    SECRET_KEY.encode(), b"jobsite.installation-id", hashlib.sha256).hexdigest()[:12]
if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", JOBSITE_INSTALLATION_ID):
    raise ImproperlyConfigured("JOBSITE_INSTALLATION_ID must be 1 to 40 letters, digits, '-' or '_'.")
JOBSITE_REDIS_PREFIX = f"jobsite:{JOBSITE_INSTALLATION_ID}:"
if REDIS_URL:
    CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = JOBSITE_REDIS_PREFIX + "ws:"
    CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": JOBSITE_REDIS_PREFIX + "celery:"}
# A signed channel-layer message sent longer ago than this (or this far ahead of the receiver's clock) is dropped as
# stale: a message recorded off the wire cannot put an old row back on a page later.
JOBSITE_CHANNEL_MESSAGE_MAX_AGE_SECONDS = env.float("JOBSITE_CHANNEL_MESSAGE_MAX_AGE_SECONDS", default=60.0)

# Nothing of jobsite's own state lives in the cache (the failed-login counts are rows of the database: jobs.api.auth);
# Redis in production, under the installation's prefix, one connection pool per process (jobsite.cache).
if REDIS_URL and not JOBSITE_TESTING:
    CACHES = {"default": {"BACKEND": "jobsite.cache.SharedRedisCache", "LOCATION": REDIS_URL,
                          "KEY_PREFIX": JOBSITE_REDIS_PREFIX + "cache"}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
# API tokens expire this long after they were issued (a new POST /api/v1/auth/token/ then issues another).
JOBSITE_API_TOKEN_TTL_SECONDS = env.int("JOBSITE_API_TOKEN_TTL_SECONDS", default=30 * 86400)
# After this many failed logins of one username from one address within the window, its logins are refused (429)
# until the window (counted from the first failure) ends.
JOBSITE_LOGIN_MAX_FAILURES = env.int("JOBSITE_LOGIN_MAX_FAILURES", default=10)
JOBSITE_LOGIN_FAILURE_WINDOW_SECONDS = env.int("JOBSITE_LOGIN_FAILURE_WINDOW_SECONDS", default=300)
# Request bodies larger than this are refused (413) at the ASGI edge before Django reads them (jobsite.limits): far
# above any job submission (the API itself takes at most JOBSITE_API_MAX_BODY_BYTES).
JOBSITE_MAX_BODY_BYTES = env.int("JOBSITE_MAX_BODY_BYTES", default=4 << 20)
# Django reads bodies up to the same size (its default, 2.5 MB, would answer a bare 400 page): the edge refuses
# anything larger, so an oversized form field reaches its form and is refused next to the field, the form kept.
DATA_UPLOAD_MAX_MEMORY_SIZE = JOBSITE_MAX_BODY_BYTES
# The API (/api/v1/) refuses (413) request bodies larger than this, from Content-Length, before parsing them
# (jobs.api.body_limit); its schema states the same figure. Keep it at most JOBSITE_MAX_BODY_BYTES: the edge
# refuses anything larger first.
JOBSITE_API_MAX_BODY_BYTES = env.int("JOBSITE_API_MAX_BODY_BYTES", default=1 << 20)
# Every response's Content-Security-Policy (jobsite.security); empty: none. Scripts, styles, fonts and images come
# from this site only, WebSockets and fetches go to it only, and no other site may frame the pages.
JOBSITE_CSP = env.str("JOBSITE_CSP", default=(
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'none'"
))
# Served over HTTPS (TLS ending at the ingress or proxy, which sets X-Forwarded-Proto): browsers are told to use
# HTTPS only (HSTS), cookies are sent over HTTPS only, and plain HTTP is redirected. Off by default, as `make run`
# and `make prod` serve plain HTTP on this machine; probes reach /healthz over HTTP before the redirect.
JOBSITE_HTTPS = env.bool("JOBSITE_HTTPS", default=False)
if JOBSITE_HTTPS:
    SECURE_HSTS_SECONDS = env.int("JOBSITE_HSTS_SECONDS", default=365 * 86400)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True

# --- notifications -------------------------------------------------------------------------------------------
# Users subscribe to events of their jobs (ended, succeeded, failed, running) by email or webhook. Email goes
# through Django's email backend: the console backend (printed by the server) unless EMAIL_BACKEND names another,
# e.g. django.core.mail.backends.smtp.EmailBackend with EMAIL_HOST, EMAIL_PORT, EMAIL_HOST_USER,
# EMAIL_HOST_PASSWORD and EMAIL_USE_TLS.
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="jobsite <jobsite@localhost>")
# The site's address as users reach it: the links in notifications (a job's page is <JOBSITE_BASE_URL>/jobs/<id>/).
JOBSITE_BASE_URL = env.str("JOBSITE_BASE_URL", default=f"http://127.0.0.1:{PORT}")
# Webhooks to this machine, loopback, link-local, private (RFC 1918, unique-local IPv6) or other non-global addresses
# are refused, when subscribing and again at each send, unless the host name, or the address it resolves to (by
# CIDR), is listed here: comma-separated host names or CIDRs, e.g. "hooks.lab.internal,10.20.0.0/16".
JOBSITE_NOTIFY_ALLOW_HOSTS = env.list("JOBSITE_NOTIFY_ALLOW_HOSTS", default=[])
# One webhook POST's connect and read timeout, in seconds.
JOBSITE_NOTIFY_TIMEOUT_SECONDS = env.float("JOBSITE_NOTIFY_TIMEOUT_SECONDS", default=10.0)
EMAIL_TIMEOUT = JOBSITE_NOTIFY_TIMEOUT_SECONDS  # an SMTP send is bounded the same way
# A worker that took a notification holds it this long (no other worker sends it meanwhile); after that a worker
# that died mid-send is presumed gone and the sweep sends it again, with the same delivery id. Keep it well above
# the timeout.
JOBSITE_NOTIFY_LEASE_SECONDS = env.float("JOBSITE_NOTIFY_LEASE_SECONDS", default=120.0)
# Tries before a notification is given up (FAILED, with a Warning event on the job); the wait after the n-th failed
# try is JOBSITE_NOTIFY_BACKOFF_SECONDS × 2^(n-1), at most an hour.
JOBSITE_NOTIFY_MAX_TRIES = env.int("JOBSITE_NOTIFY_MAX_TRIES", default=8)
JOBSITE_NOTIFY_BACKOFF_SECONDS = env.float("JOBSITE_NOTIFY_BACKOFF_SECONDS", default=30.0)
# How often the Celery beat (or the embedded sender) sweeps for due notifications no task took, and retries.
JOBSITE_NOTIFY_SWEEP_SECONDS = env.float("JOBSITE_NOTIFY_SWEEP_SECONDS", default=10.0)
# Send from a thread of the web process instead of the Celery worker: the embedded default (`make run`, no Redis and
# so no worker); production (REDIS_URL) sends from the worker.
JOBSITE_NOTIFY_INPROCESS = env.bool("JOBSITE_NOTIFY_INPROCESS", default=not REDIS_URL)

# --- GPU telemetry ---------------------------------------------------------------------------------------------
# The leader samples every JOBSITE_GPU_SAMPLE_SECONDS (0: never): NVML locally, a DCGM exporter's URL on Kubernetes.
# A running job whose GPUs all stay under JOBSITE_GPU_IDLE_UTIL % for JOBSITE_GPU_IDLE_MINUTES is warned once a spell.
JOBSITE_GPU_SAMPLE_SECONDS = env.float("JOBSITE_GPU_SAMPLE_SECONDS", default=10.0)
JOBSITE_GPU_METRICS_URL = env.str("JOBSITE_GPU_METRICS_URL", default="")
JOBSITE_GPU_IDLE_UTIL = env.float("JOBSITE_GPU_IDLE_UTIL", default=5.0)
JOBSITE_GPU_IDLE_MINUTES = env.float("JOBSITE_GPU_IDLE_MINUTES", default=30.0)
JOBSITE_GPU_IDLE_STOP_INTERACTIVE_MINUTES = env.float("JOBSITE_GPU_IDLE_STOP_INTERACTIVE_MINUTES", default=None)
# --- exec into running jobs (jobs/exec_consumers.py, jobctl exec) ---------------------------------------------
# The browser's terminal (xterm.js), served from the npm packages `make node_modules` installs (package.json).
STATICFILES_DIRS += [(f"vendor/{name}", BASE_DIR / "node_modules" / "@xterm" / package)
                     for name, package in (("xterm", "xterm"), ("xterm-addon-fit", "addon-fit"))
                     if (BASE_DIR / "node_modules" / "@xterm" / package).is_dir()]
# A session with no byte either way this long is closed (command killed); each checks its job still Runs this often.
JOBSITE_EXEC_IDLE_SECONDS = env.float("JOBSITE_EXEC_IDLE_SECONDS", default=1800.0)
JOBSITE_EXEC_CHECK_SECONDS = env.float("JOBSITE_EXEC_CHECK_SECONDS", default=5.0)
JOBSITE_GATEWAY_URL = env.str("JOBSITE_GATEWAY_URL", default="")  # host:port of `rungateway` (Kubernetes exec, ports)
from .settings_launcher import *  # noqa: E402,F403 - the local backend's launcher
from .settings_ports import *  # noqa: E402,F403 - a job's ports' own host names (JOBSITE_PORTS_DOMAIN)
from .settings_web import *  # noqa: E402,F403 - the web process's request threads
