"""The scheduler in virtual time, apart from the production scheduler: replay a workload on the simulated backend.

- ``workload``: the JSON Lines workload a replay runs, parsed and checked;
- ``replay``: the replay itself, the scheduler's decisions on a virtual clock, in memory;
- ``history``: the recent history as a workload (what if the quotas had been others);
- ``report``: the figures of a replay, as lines to print.
"""
