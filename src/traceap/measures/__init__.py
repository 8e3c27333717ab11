"""The physical measurements of a trace that both the GPU idle account and the rules use.

Below `traceap.idle` and `traceap.patterns`, so that the idle account and the eight rules
count the same rows with the same thresholds: `signals` (interval arithmetic, name masks,
per-window sums, `per_episode`, the cache), `compile_regions` (torch.compile regions and the
gaps between them), `communication` (NCCL on compute streams, small collectives), `copies`
(host<->device copies, host-blocking syncs and the GPU gap each costs, pageable uploads).
A measurement here reads the `Trace` (or `Windows`) only, never a score or the idle account.
"""
