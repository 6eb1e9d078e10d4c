"""The Kubernetes gateway (``manage.py rungateway``): exec and port-forward into job pods, for the web.

The web holds no cluster credentials and the scheduler stays the only one that creates, deletes and watches pods;
this process, with its own ServiceAccount (deploy/base/gateway.yaml), holds exactly ``pods`` get and
``pods/exec``, ``pods/portforward`` create and get in the jobs namespace (``RBAC_RULES``).

Protocol (``jobs.gateway_wire``, shared with the web's side, ``jobs.gateway_door``), one TCP connection a session:

1. The web sends one line: a ticket signed with the site's key (``django.core.signing``, salt
   ``jobsite.gateway.ticket``), at most 30 s old and used once, naming the installation, job, attempt, rank and a
   command (tty, rows, cols) or a port. The web signs one only after its own checks: the user sees the job, it is
   Running, the port is declared.
2. The gateway reads the pod ``job-<id>-<attempt>-<rank>`` and requires this installation's labels
   (``app.kubernetes.io/managed-by``, ``jobsite/installation``) and the ticket's job, attempt and rank, and phase
   Running; it answers one JSON line, ``{"ok": true}`` or ``{"error", "status"}`` (403, 404, 409, 502).
3. A port: ``kubernetes.stream.portforward`` to the pod's port, and raw bytes both ways on the connection.
   A command: ``connect_get_namespaced_pod_exec`` through ``kubernetes.stream.stream(..., _preload_content=False)``
   (the ``v4.channel.k8s.io`` channels), in the container ``main``, relayed as frames: channel (1 byte), length
   (4 bytes, big-endian), data; 0 stdin and 4 resize from the web, 1 stdout and 2 stderr to it, then 3 status,
   ``{"exit": code}`` from the API server's error channel (its Status), and the connection closes.
"""

# What the gateway calls in the jobs namespace (deploy/base/gateway.yaml grants exactly this; tests/k8s check it).
RBAC_RULES = {"pods": frozenset({"get"}), "pods/exec": frozenset({"create", "get"}),
              "pods/portforward": frozenset({"create", "get"})}
