"""Checkpoint I/O: weights + config + platform table + the text embeddings of the training
vocabulary, in one torch file (loaded with weights_only=True).  Reloading gives identical scores."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from ..errors import ModelError
from .config import ModelConfig
from .net import TraceAPModel
from .text import ENCODER_ID

FORMAT = "traceap.model/v1"


def bundled_model_path() -> Path:
    """The default checkpoint shipped inside the package."""
    return Path(str(resources.files("traceap") / "data" / "model.pt"))


@dataclass
class Checkpoint:
    """A loaded model with what it needs to score new traces."""

    model: TraceAPModel
    text_table: dict[str, np.ndarray]      # name -> float16 embedding (training vocabulary)
    encoder_id: str = ENCODER_ID
    meta: dict = field(default_factory=dict)
    path: str = ""


def save_model(model: TraceAPModel, path: str | os.PathLike, text_table: dict[str, np.ndarray],
               meta: dict | None = None, encoder_id: str = ENCODER_ID) -> Path:
    """Write a checkpoint (atomically).  `text_table` holds the names the model was trained on."""
    path = Path(path)
    names = sorted(text_table)
    emb = np.stack([np.asarray(text_table[n], np.float16) for n in names]) if names else \
        np.zeros((0, model.cfg.text_dim), np.float16)
    obj = {
        "format": FORMAT,
        "config": model.cfg.to_dict(),
        "platforms": list(model.platforms),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "names": names,
        "name_embeddings": torch.from_numpy(emb),
        "encoder_id": encoder_id,
        "meta": meta or {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)
    return path


def load_model(path: str | os.PathLike | None = None) -> Checkpoint:
    """Read a checkpoint (None: the bundled default).  Raises ModelError on any problem."""
    path = Path(path) if path is not None else bundled_model_path()
    if not path.is_file():
        raise ModelError(f"{path}: no such model checkpoint")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a bad file
        raise ModelError(f"{path}: not a readable model checkpoint ({type(exc).__name__})") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ModelError(f"{path}: not a traceap model checkpoint (expected {FORMAT})")
    try:
        cfg = ModelConfig.from_dict(obj["config"])
        model = TraceAPModel(cfg, list(obj["platforms"]))
        model.load_state_dict(obj["state_dict"])
        emb = obj["name_embeddings"].numpy()
        table = dict(zip(obj["names"], emb))
    except (KeyError, RuntimeError, TypeError, ValueError) as exc:
        raise ModelError(f"{path}: incompatible model checkpoint ({exc})") from None
    model.eval()
    return Checkpoint(model, table, obj.get("encoder_id", ENCODER_ID), obj.get("meta", {}),
                      str(path))


__all__ = ["Checkpoint", "FORMAT", "bundled_model_path", "load_model", "save_model"]
