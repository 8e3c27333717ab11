"""The physical measurements of a trace that both the GPU idle account and the rules use.

Below `traceap.idle` and `traceap.patterns`, so that the idle account and the rules
count the same rows with the same thresholds: `signals` (interval arithmetic, name masks,
per-window sums, `per_episode`, the cache), `gaps` (the GPU span, its idle gaps, work queued,
the gaps data loading fills), `warmup` (one-off start-up), `host` (the user's code: Python in
the host's holes between framework calls and ops on host tensors; unrecorded work), `compile_regions` (torch.compile regions
and the gaps between them), `communication` (NCCL on compute streams, small collectives, NCCL
that only looks exposed because the host is late), `copies` (host<->device copies,
host-blocking syncs and the GPU gap each costs, pageable uploads), and one module per
mechanism of the newer patterns.  A measurement here reads the `Trace` (or `Windows`) only,
never a score or the idle account; the idle account assigns what they measure.
"""
