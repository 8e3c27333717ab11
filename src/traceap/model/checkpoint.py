"""Checkpoint I/O: weights + config + platform table + the text embeddings of the training
vocabulary, in one torch file.  Reloading gives identical scores.

Reading needs no torch: the file is torch's zip format (a pickle plus one raw file per tensor),
read here with an unpickler that knows only tensors, storages and ordered dicts, the same
allow-list `torch.load(weights_only=True)` applies, into numpy arrays.  The torch model is built
from those arrays only when something asks for it (`Checkpoint.model`: training, ablations);
scoring runs on the arrays (`inference.InferenceModel`).
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import ModelError
from .config import TRAINING_FIELDS, ModelConfig
from .text import ENCODER_ID

FORMAT = "traceap.model/v1"


def bundled_model_path() -> Path:
    """The default checkpoint shipped inside the package."""
    return Path(str(resources.files("traceap") / "data" / "model.pt"))


@dataclass
class Checkpoint:
    """A loaded checkpoint: config, platform table, weights as arrays, training vocabulary."""

    config: ModelConfig
    platforms: list[str]
    state: dict[str, np.ndarray]           # parameter name -> float32 array
    text_table: dict[str, np.ndarray]      # name -> float16 embedding (training vocabulary)
    encoder_id: str = ENCODER_ID
    meta: dict = field(default_factory=dict)
    path: str = ""
    #: further weights of an ensemble (same config, platforms and vocabulary): their window
    #: logits and pattern logits are averaged with those of `state`
    members: list[dict[str, np.ndarray]] = field(default_factory=list)
    _model: object = field(default=None, repr=False)

    @property
    def states(self) -> list[dict[str, np.ndarray]]:
        """The weights of every member, `state` first (one entry for a single model)."""
        return [self.state, *self.members]

    def torch_models(self) -> list:
        """A torch `TraceAPModel` in eval mode per member (`model` first)."""
        return [self.model] + [self._build(s) for s in self.members]

    @property
    def model(self):
        """The torch `TraceAPModel` in eval mode (built on first use; imports torch)."""
        if self._model is None:
            self._model = self._build(self.state)
        return self._model

    def _build(self, state: dict[str, np.ndarray]):
        from .._torch import require_torch

        torch = require_torch("the torch model (engine='torch')")
        from .net import TraceAPModel
        model = TraceAPModel(self.config, list(self.platforms))
        try:
            model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
        except RuntimeError as exc:
            raise ModelError(f"{self.path}: incompatible model checkpoint ({exc})") from None
        return model.eval()


def save_model(model, path: str | os.PathLike, text_table: dict[str, np.ndarray],
               meta: dict | None = None, encoder_id: str = ENCODER_ID,
               members: list[dict[str, np.ndarray]] | None = None) -> Path:
    """Write a `TraceAPModel` checkpoint (atomically).  `text_table` holds the names the model
    was trained on; `members`, the further weights of an ensemble (`Checkpoint.members`)."""
    import torch

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
    if members:
        obj["members"] = [{k: torch.from_numpy(np.array(v)) for k, v in m.items()} for m in members]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)
    return path


def add_members(path: str | os.PathLike, members: list[str | os.PathLike],
                out: str | os.PathLike | None = None, meta: dict | None = None) -> Path:
    """Make the checkpoint at `path` an ensemble: append the weights of each checkpoint in
    `members` (same config, platforms and text encoder; their names join the vocabulary),
    `meta` merged into its meta, written to `out` (default: in place).  Raises ModelError when
    a member does not fit."""
    import torch

    obj = torch.load(path, weights_only=True)
    names = dict(zip(obj["names"], obj["name_embeddings"]))
    extra = list(obj.get("members", []))
    runs = member_runs(obj)
    for m in members:
        other = torch.load(m, weights_only=True)
        heads = [_head_of(c) for c in (obj, other)]
        if heads[0] != heads[1]:   # averaged pattern logits must name the same patterns
            raise ModelError(f"{m}: cannot join {path} in an ensemble "
                             f"({_head_difference(*heads, str(path))})")
        for key in ("config", "platforms", "encoder_id"):
            mine, theirs = obj.get(key), other.get(key)
            if key == "config":   # seeds, losses and schedules may differ: the network may not
                mine, theirs = ({k: v for k, v in _network(c).items() if k not in TRAINING_FIELDS}
                                for c in (mine, theirs))
            if theirs != mine:
                raise ModelError(f"{m}: cannot join {path} in an ensemble (its {key} differs)")
        extra += [other["state_dict"], *other.get("members", [])]
        runs += member_runs(other)
        for n, e in zip(other["names"], other["name_embeddings"]):
            names.setdefault(n, e)
    obj["members"] = extra
    obj["meta"] = {**obj.get("meta", {}), **(meta or {}), "member_runs": runs}
    obj["names"] = sorted(names)
    obj["name_embeddings"] = (torch.stack([names[n] for n in obj["names"]]) if names
                              else obj["name_embeddings"])
    out = Path(out or path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, out)
    return out


def _network(config: dict) -> dict:
    """A checkpoint's stored config with every field present (older checkpoints lack the
    fields added since: their defaults, and the legacy pattern head), so that two are compared
    by what they mean."""
    return ModelConfig.from_dict(config).to_dict()


def _head_of(obj: dict) -> tuple[str, ...]:
    """The pattern ids of a checkpoint object's pattern head."""
    return ModelConfig.from_dict(obj.get("config", {})).with_head().head_patterns


def _head_difference(mine: Sequence[str], theirs: Sequence[str], name: str) -> str:
    """How another checkpoint's pattern head differs from that of `name`, in a few words."""
    if len(mine) != len(theirs):
        return f"its pattern head names {len(theirs)} patterns, that of {name} {len(mine)}"
    i = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
    return f"output {i + 1} of its pattern head is {theirs[i]}, that of {name} {mine[i]}"


#: What `member_runs` keeps of each member's training record.
RUN_KEYS = ("run", "command", "dataset", "n_train", "best_epoch", "epochs", "steps",
            "train_seconds")


def member_runs(obj: dict) -> list[dict]:
    """How each set of weights in a checkpoint object was trained, in the order of its
    states: its training settings (the config's `TRAINING_FIELDS`: seed, losses, schedule,
    pretraining) and the main keys of its training record.  An ensemble keeps those of its
    members (`meta["member_runs"]`); a single checkpoint gives one."""
    n = 1 + len(obj.get("members", []))
    meta = obj.get("meta", {})
    kept = meta.get("member_runs")
    if kept and len(kept) == n:
        return list(kept)
    # no record per member (or one that no longer matches the weights): the config and the
    # record describe the first set of weights; further ones are unknown
    pre = meta.get("pretrain")
    first = {"config": {k: v for k, v in obj.get("config", {}).items() if k in TRAINING_FIELDS},
             **{k: meta[k] for k in RUN_KEYS if k in meta},
             **({"pretrain": {k: v for k, v in pre.items() if k != "log"}}
                if isinstance(pre, dict) else {})}
    return [first] + [{} for _ in range(n - 1)]


# torch's storage classes -> numpy dtypes (bfloat16 is widened to float32 on reading)
_STORAGE_DTYPES = {"FloatStorage": np.float32, "HalfStorage": np.float16,
                   "DoubleStorage": np.float64, "LongStorage": np.int64, "IntStorage": np.int32,
                   "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
                   "BoolStorage": np.bool_, "BFloat16Storage": "bfloat16"}


def _rebuild_tensor(storage, offset, size, stride, *_):
    """torch._utils._rebuild_tensor_v2, as a numpy array (a copy)."""
    itemsize = storage.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size),
                                           strides=tuple(s * itemsize for s in stride))
    return np.array(view)


def _rebuild_parameter(data, *_):
    """torch._utils._rebuild_parameter: a parameter is its data."""
    return data


class _TensorUnpickler(pickle.Unpickler):
    """Reads torch's data.pkl into numpy: storages from the zip, nothing else allowed."""

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str):
        super().__init__(io.BytesIO(data))
        self.archive, self.prefix = archive, prefix
        self.storages: dict[str, np.ndarray] = {}   # tensors that share a storage share it here

    def find_class(self, module: str, name: str):
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a checkpoint")

    def persistent_load(self, pid):
        kind, dtype, key, _location, _numel = pid
        if kind != "storage":
            raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
        if key not in self.storages:
            raw = self.archive.read(f"{self.prefix}/data/{key}" if self.prefix else f"data/{key}")
            if isinstance(dtype, str):  # bfloat16: the high half of a float32
                arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
            else:
                arr = np.frombuffer(raw, dtype)
            self.storages[key] = arr
        return self.storages[key]


def read_checkpoint(path: str | os.PathLike) -> object:
    """The object a torch checkpoint file holds, tensors as numpy arrays (no torch needed).

    Raises ModelError when the file is not a readable torch zip checkpoint."""
    try:
        with zipfile.ZipFile(path) as archive:
            pkl = next(n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
            prefix = pkl.rpartition("/")[0]
            byteorder = f"{prefix}/byteorder" if prefix else "byteorder"
            if byteorder in archive.namelist() and archive.read(byteorder) != b"little":
                raise ValueError("big-endian checkpoint")
            return _TensorUnpickler(archive.read(pkl), archive, prefix).load()
    except (OSError, zipfile.BadZipFile, StopIteration, pickle.UnpicklingError, ValueError,
            KeyError, EOFError, TypeError, AttributeError) as exc:
        raise ModelError(f"{path}: not a readable model checkpoint ({type(exc).__name__})") from None


def load_model(path: str | os.PathLike | None = None) -> Checkpoint:
    """Read a checkpoint (None: the bundled default).  Raises ModelError on any problem."""
    path = Path(path) if path is not None else bundled_model_path()
    if not path.is_file():
        raise ModelError(f"{path}: no such model checkpoint")
    obj = read_checkpoint(path)
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ModelError(f"{path}: not a traceap model checkpoint (expected {FORMAT})")
    try:
        cfg = ModelConfig.from_dict(obj["config"]).with_head()
        state = {k: np.asarray(v) for k, v in obj["state_dict"].items()}
        members = [{k: np.asarray(v) for k, v in m.items()} for m in obj.get("members", [])]
        table = dict(zip(obj["names"], np.asarray(obj["name_embeddings"])))
        ckpt = Checkpoint(cfg, list(obj["platforms"]), state, table,
                          obj.get("encoder_id", ENCODER_ID), obj.get("meta", {}), str(path),
                          members)
        from .inference import InferenceModel
        for s in ckpt.states:
            InferenceModel(cfg, ckpt.platforms, s)  # every weight there, with its shape
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ModelError(f"{path}: incompatible model checkpoint ({exc})") from None
    except ModelError as exc:
        raise ModelError(f"{path}: incompatible model checkpoint ({exc})") from None
    return ckpt


def prepare_out(path: str | os.PathLike, overwrite: bool = False) -> str | None:
    """Check that a checkpoint may be written at `path` before training starts; returns a
    note when it replaces an earlier one.  A file that is not a traceap checkpoint is never
    replaced; an earlier checkpoint (hours of training) only with `overwrite`."""
    from ..outputs import check_replaceable

    return check_replaceable(path, "--out", "traceap checkpoint", is_checkpoint, overwrite,
                             command="traceap train",
                             held="the checkpoint of an earlier traceap train run",
                             replaced="the checkpoint of an earlier train run",
                             not_done="nothing trained")


def is_checkpoint(path: str | os.PathLike) -> bool:
    """Whether `path` is a torch-saved traceap checkpoint (any file torch cannot read is not)."""
    import torch

    try:
        obj = torch.load(path, weights_only=True, map_location="cpu")
    except Exception:  # noqa: BLE001 - any file torch cannot read is not ours
        return False
    return isinstance(obj, dict) and obj.get("format") == FORMAT


__all__ = ["Checkpoint", "FORMAT", "add_members", "bundled_model_path", "load_model", "member_runs",
           "is_checkpoint", "prepare_out", "read_checkpoint", "save_model"]
