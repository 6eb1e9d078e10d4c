"""The backends: the hands that start, stop, observe and list replicas (local processes, Kubernetes pods, a
simulation). None of them touches the database or the services; the scheduler builds them
(``scheduler.backend_factory``) and records what they report."""
