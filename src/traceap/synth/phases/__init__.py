"""One rank's profiler step, phase by phase: each module is a mixin of `simulator._Run`.

A step runs `data_loading` (DataLoader `__next__`, input H2D copies) > `forward` (eager) or
`compiled` (torch.compile regions, graph breaks) > `loss` (loss, metrics, `.item()` syncs,
Python-heavy loops) > `backward` (autograd thread, DDP buckets) with `communication` (NCCL
collectives, DDP finalize) > `optimizer` (step, zero_grad, GradScaler).  `host_ops` holds the
eager-op building blocks they all call; `_state` the shared state and tables.  `_Run` in
`simulator.py` owns the state and the order of the phases.
"""
