"""Make a trained checkpoint the one traceap ships (run by hand when retraining the default).

    python -m traceap.model.bundle CHECKPOINT [TRACE ...]

Writes `traceap/data/model.pt` (the weights, without the name embeddings) and
`traceap/data/name_embeddings.npz` (the checkpoint's training vocabulary plus the event names
of the given traces, e.g. the examples), so that scoring rarely needs the text encoder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from ..load import load
from ..trace import GPU_WORK_KINDS
from .checkpoint import bundled_model_path, load_model, save_model
from .text import TextEncoder, bundled_cache_path, save_cache


def trace_names(path: str) -> list[str]:
    """Names the model would look up for a trace: GPU work and the CPU ops that launch it."""
    t = load(path)
    rows = t.rows(*GPU_WORK_KINDS)
    parents = t.cpu_op[rows]
    codes = np.unique(np.concatenate([t.name[rows], t.name[parents[parents >= 0]]]))
    return [t.names[c] for c in codes]


def bundle(checkpoint: str, traces: list[str]) -> tuple[Path, Path, int]:
    """Install a checkpoint and its name cache as the package defaults; returns paths, #names."""
    ckpt = load_model(checkpoint)
    table = {n: np.asarray(v, np.float16) for n, v in ckpt.text_table.items()}
    extra = sorted({n for p in traces for n in trace_names(p)} - set(table))
    if extra:
        enc = TextEncoder(use_bundled=False, use_user_cache=False)
        table.update(zip(extra, enc.embed(extra, persist=False).astype(np.float16)))
    save_cache(bundled_cache_path(), table)
    meta = dict(ckpt.meta, vocabulary="traceap/data/name_embeddings.npz")
    save_model(ckpt.model, bundled_model_path(), {}, meta=meta, encoder_id=ckpt.encoder_id,
               members=ckpt.members)
    return bundled_model_path(), bundled_cache_path(), len(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m traceap.model.bundle", description=__doc__)
    ap.add_argument("checkpoint")
    ap.add_argument("traces", nargs="*")
    args = ap.parse_args(argv)
    model, cache, n = bundle(args.checkpoint, args.traces)
    print(f"wrote {model} ({model.stat().st_size / 1e6:.2f} MB) and {cache} "
          f"({cache.stat().st_size / 1e6:.2f} MB, {n} names)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
