"""Bounds on what a user may ask for, shared by the form, the API and the submit service."""

import re

NAME_MAX = 128
COMMAND_MAX_BYTES = 64 * 1024
ENV_MAX_VARS = 100
ENV_VALUE_MAX_BYTES = 32 * 1024
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by jobsite for every replica; a user may not override them.
# Set by jobsite for every replica (identity, devices, and what distributed launchers read): a job may not set them.
RESERVED_ENV = frozenset({
    "JOB_ID", "JOB_NAME", "JOB_USER", "JOB_GROUP", "JOB_ATTEMPT", "PRIMEHUB_USER", "PRIMEHUB_GROUP",
    "CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
    "MASTER_PORT", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR", "PET_MASTER_PORT",
    "JOB_HOSTFILE",
})
REPLICAS_MAX = 64
BACKOFF_LIMIT_MAX = 100
ACTIVE_DEADLINE_MAX = 30 * 86400
TTL_MAX = 365 * 86400
