"""GPU telemetry: samplers that read GPU figures (NVML on this host, a DCGM exporter on Kubernetes) and the
scheduler step that attributes them to running attempts. Parsing is pure; the I/O is a thin layer around it."""
