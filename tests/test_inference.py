"""Scoring without torch: the numpy forward equals the torch model, checkpoints read without
torch, and `traceap info` / `analyze` (expert or default) never import torch."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from traceap.load import load
from traceap.model import create_model, load_model, preset, save_model
from traceap.model.checkpoint import read_checkpoint
from traceap.model.features import batch_arrays, featurize
from traceap.model.inference import InferenceModel
from traceap.model.predict import Predictor
from traceap.model.text import hashing_embedding
from traceap.windows import Windows

from .conftest import DATA, REPO, CNN

SMALL = replace(preset("small"), max_events=16)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEAP_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def feats():
    """Features of two real traces (NVIDIA A100 DDP, AMD MI250) with 40 windows each."""
    return [featurize(Windows(load(p), 40), SMALL)
            for p in (CNN, DATA / "amd_mi250_train.json.gz")]


@pytest.fixture(scope="module")
def table(feats) -> dict[str, np.ndarray]:
    names = sorted({str(n) for f in feats for n in f.names[1:]})
    return dict(zip(names, hashing_embedding(names)))


def _outputs_agree(model, feats, table, atol=1e-5):
    torch.manual_seed(0)
    for p in model.parameters():  # random, not the initial zeros/ones, so every weight counts
        p.data.normal_(0.0, 0.3 / max(1, p.shape[-1]) ** 0.5 if p.dim() > 1 else 0.3)
    model.eval()
    arrays = batch_arrays(feats, model.platform_id, model.cfg, table)
    with torch.no_grad():
        ref = model({k: torch.from_numpy(v) for k, v in arrays.items()})
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    out = InferenceModel(model.cfg, model.platforms, state)(arrays)
    for key in ("scores", "logits", "pattern_logits", "emb"):
        assert np.abs(out[key] - ref[key].numpy()).max() < atol, key


@pytest.mark.parametrize("switches", [
    {}, {"no_event_adapter": True}, {"no_transformer": True}, {"no_relation": True},
    {"window_summary": False}, {"summary_relative": False, "relation_layers": 2, "layers": 1},
    {"time_relative": True}, {"time_relative": True, "time_absolute": False},
    {"summary_absolute": False, "summary_extra": True}, {"names_masked": True},
    {"platform_embedding": False}, {"host_events": 8, "time_relative": True},
    {"summary_idle": True, "summary_absolute": False, "time_relative": True},
    {"summary_idle": True, "summary_split": True, "summary_absolute": False},
])
def test_numpy_forward_equals_the_torch_model(feats, table, switches):
    cfg = replace(SMALL, **switches)
    platforms = ["unknown", feats[0].platform]              # one known platform, one unseen
    _outputs_agree(create_model(cfg, platforms), feats, table)


def test_bundled_model_scores_the_same_on_numpy_and_torch():
    windows = Windows(load(CNN), 100)
    a = Predictor(engine="numpy").predict(windows)
    b = Predictor(engine="torch").predict(windows)
    assert np.abs(a.scores - b.scores).max() < 1e-5
    assert np.abs(a.patterns - b.patterns).max() < 1e-5


def test_an_ensemble_averages_its_members_logits(tmp_path):
    """Seeds of one recipe joined by `add_members`: a window's score is the sigmoid of the
    members' mean logit and its pattern probabilities those of their mean pattern logits, on
    numpy and torch alike; the bundled model as its own two members scores as itself; a
    checkpoint of another network does not join, with a one-line reason (another seed does)."""
    from traceap.errors import ModelError
    from traceap.model.checkpoint import add_members, bundled_model_path
    from traceap.model.ops import sigmoid

    windows = Windows(load(CNN), 100)
    # the bundled checkpoint's first member alone (the bundled one may itself be an ensemble)
    obj = {k: v for k, v in torch.load(bundled_model_path(), weights_only=True).items()
           if k != "members"}
    base = tmp_path / "base.pt"
    torch.save(obj, base)
    assert len(load_model(base).states) == 1
    gen = torch.Generator().manual_seed(0)
    other = {**obj, "config": {**obj["config"], "seed": obj["config"]["seed"] + 1},  # a seed
             "state_dict": {k: v + 0.05 * torch.randn(v.shape, generator=gen)
                            if v.is_floating_point() else v
                            for k, v in obj["state_dict"].items()}}
    torch.save(other, tmp_path / "other.pt")
    ens = add_members(base, [tmp_path / "other.pt"], out=tmp_path / "ens.pt")
    assert len(load_model(ens).states) == 2
    runs = load_model(ens).meta["member_runs"]    # how each member was trained, in order
    assert [r["config"]["seed"] for r in runs] == [obj["config"]["seed"], obj["config"]["seed"] + 1]
    assert all("log" not in r.get("pretrain", {}) for r in runs)
    trio = add_members(ens, [base], out=tmp_path / "trio.pt")   # an ensemble joined again
    seed = obj["config"]["seed"]
    trio_runs = load_model(trio).meta["member_runs"]
    assert [r["config"]["seed"] for r in trio_runs] == [seed, seed + 1, seed]

    def raw(path):
        p = Predictor(path)
        f = p.featurize(windows)
        names = [str(n) for n in f.names[1:]]
        batch = batch_arrays([f], p.net.platform_id, p.cfg, dict(zip(names, p.text.embed(names))))
        out = p.net(batch)
        return out["logits"][0], out["pattern_logits"][0]

    (l1, p1), (l2, p2) = raw(base), raw(tmp_path / "other.pt")
    assert np.abs(l1 - l2).max() > 0.05          # the second member really differs
    got = Predictor(ens).predict(windows)
    assert np.abs(got.scores - sigmoid((l1 + l2) / 2)).max() < 1e-5
    assert np.abs(got.patterns - sigmoid((p1 + p2) / 2)).max() < 1e-5
    torch_got = Predictor(ens, engine="torch").predict(windows)
    assert np.abs(torch_got.scores - got.scores).max() < 1e-5

    twice = add_members(base, [base], out=tmp_path / "twice.pt")
    single = Predictor(base).predict(windows)
    assert np.abs(Predictor(twice).predict(windows).scores - single.scores).max() < 1e-6

    torch.save({**obj, "config": {**obj["config"], "d": obj["config"]["d"] * 2}},
               tmp_path / "wide.pt")
    with pytest.raises(ModelError, match="config differs"):
        add_members(base, [tmp_path / "wide.pt"], out=tmp_path / "no.pt")


def test_checkpoints_read_without_torch_exactly(tmp_path):
    """Every dtype, views sharing a storage, transposed and empty tensors, come back exact."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    obj = {"format": "x", "nested": {"t": base.t(), "row": base[2], "tuple": (1, "a")},
           "half": torch.randn(3, 5).half(), "bf16": torch.randn(7).bfloat16(),
           "long": torch.arange(5), "bool": torch.tensor([True, False]),
           "empty": torch.zeros(0, 384, dtype=torch.float16), "scalar": torch.tensor(2.5)}
    torch.save(obj, tmp_path / "x.pt")
    got = read_checkpoint(tmp_path / "x.pt")
    assert np.array_equal(got["nested"]["t"], base.t().numpy())
    assert np.array_equal(got["nested"]["row"], base[2].numpy())
    assert got["nested"]["tuple"] == (1, "a")
    assert np.array_equal(got["half"], obj["half"].numpy()) and got["half"].dtype == np.float16
    assert np.array_equal(got["bf16"], obj["bf16"].float().numpy())
    assert np.array_equal(got["long"], np.arange(5)) and got["bool"].tolist() == [True, False]
    assert got["empty"].shape == (0, 384) and float(got["scalar"]) == 2.5

    model = create_model(SMALL, ["unknown", "NVIDIA A100"])
    path = save_model(model, tmp_path / "m.pt", {"aten::mm": np.ones(384, np.float16)})
    ckpt = load_model(path)
    for k, v in model.state_dict().items():
        assert np.array_equal(ckpt.state[k], v.numpy()), k
    assert ckpt.platforms == model.platforms and ckpt.config == model.cfg
    assert set(ckpt.text_table) == {"aten::mm"}


def test_a_checkpoint_from_another_model_is_a_model_error(tmp_path):
    from traceap.errors import ModelError
    model = create_model(SMALL)
    state = model.state_dict()
    del state["relation.ffn.4.weight"]
    torch.save({"format": "traceap.model/v1", "config": SMALL.to_dict(), "platforms": ["unknown"],
                "state_dict": state, "names": [], "name_embeddings": torch.zeros(0, 384)},
               tmp_path / "bad.pt")
    with pytest.raises(ModelError, match="incompatible.*relation.ffn.4.weight"):
        load_model(tmp_path / "bad.pt")
    pickled = tmp_path / "evil.pt"
    torch.save({"format": "traceap.model/v1", "f": print}, pickled)
    with pytest.raises(ModelError, match="not a readable model checkpoint"):
        load_model(pickled)


WRAPPER = """
import sys
from traceap.cli import app
seen = {}
for name, args in [("info", ["info", sys.argv[1]]),
                   ("expert", ["analyze", "--detector", "expert", "-q", sys.argv[1]]),
                   ("default", ["analyze", "-q", sys.argv[1]])]:
    try:
        app(args, standalone_mode=False)
    except SystemExit:
        pass
    seen[name] = sorted(m for m in ("torch", "transformers", "sentence_transformers")
                        if m in sys.modules)
print(seen)
"""


def test_info_and_analyze_never_import_torch(tmp_path):
    env = {"PYTHONPATH": str(REPO / "src"), "TRACEAP_CACHE": str(tmp_path / "cache"),
           "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-c", WRAPPER, str(CNN)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "{'info': [], 'expert': [], 'default': []}"
