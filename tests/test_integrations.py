"""The Lightning and Hugging Face callbacks with the real libraries, on CPU: their hooks fire
inside a real `fit`/`train`, and the profiled steps leave a trace, its analysis JSON and its
HTML report, and one printed line (issue #36, item 3).  Tiny models, no download."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from traceap.handler import outputs_of

torch = pytest.importorskip("torch")


def _profiler_steps(trace) -> int:
    """The profiler steps the trace recorded (ProfilerStep#N annotations)."""
    events = json.loads(trace.read_text())["traceEvents"]
    return len({e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})


def _files_of(traces):
    assert len(traces) == 1, traces
    trace = traces[0]
    analysis, html = outputs_of(trace)
    assert trace.is_file() and analysis.is_file() and html.is_file()
    return trace, json.loads(analysis.read_text()), html.read_text()


def test_lightning_callback_profiles_k_steps_and_reports(tmp_path, capfd):
    L = pytest.importorskip("lightning")
    from traceap.integrations.lightning import TraceapCallback

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(16, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    callback = TraceapCallback(steps=3, out=tmp_path / "prof", skip_first=2, warmup=1)
    trainer = L.Trainer(max_steps=12, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[callback])
    trainer.fit(Tiny(), loader)

    trace, analysis, html = _files_of(callback.traces)
    assert trace.parent == tmp_path / "prof" and trace.name.endswith(".pt.trace.json")
    assert analysis["schema"] == "traceap.analysis/v1"
    assert _profiler_steps(trace) == 3   # the recorded steps, not the skipped or warm-up ones
    assert "traceap report" in html
    assert f"traceap: {trace.name}, step " in capfd.readouterr().out


def test_transformers_callback_profiles_k_steps_and_reports(tmp_path, capfd, monkeypatch):
    tf = pytest.importorskip("transformers")
    import transformers.trainer

    from traceap.integrations.transformers import TraceapCallback

    # A `datasets/` folder in the checkout (where docs/RESULTS.md builds the benchmarks) is a
    # namespace package on sys.path, which transformers takes for Hugging Face `datasets`.
    spec = importlib.util.find_spec("datasets")
    if spec is not None and spec.origin is None:
        monkeypatch.setattr(transformers.trainer, "is_datasets_available", lambda: False)

    config = tf.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=32,
                           max_position_embeddings=16, num_labels=2)
    model = tf.BertForSequenceClassification(config)
    gen = torch.Generator().manual_seed(0)

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return {"input_ids": torch.randint(0, 64, (8,), generator=gen),
                    "labels": torch.tensor(i % 2)}

    callback = TraceapCallback(steps=3, out=tmp_path / "prof", skip_first=2, warmup=1)
    args = tf.TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=10,
                                per_device_train_batch_size=4, report_to=[], save_strategy="no",
                                logging_strategy="no", use_cpu=True, disable_tqdm=True)
    tf.Trainer(model=model, args=args, train_dataset=Data(), callbacks=[callback]).train()

    trace, analysis, html = _files_of(callback.traces)
    assert _profiler_steps(trace) == 3
    assert analysis["schema"] == "traceap.analysis/v1"
    assert "traceap report" in html
    # the line is the background child's, on the same stdout (file descriptor 1)
    assert f"traceap: {trace.name}, step " in capfd.readouterr().out


@pytest.mark.parametrize("module,framework", [("lightning", "Lightning"),
                                              ("transformers", "transformers")])
def test_without_the_framework_the_import_says_which_extra_to_install(module, framework):
    blocked = ("lightning", "pytorch_lightning", "transformers")
    code = textwrap.dedent(f"""
        import sys
        class Missing:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {blocked!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        sys.meta_path.insert(0, Missing())
        try:
            import traceap.integrations.{module}
        except ImportError as exc:
            print(exc)
    """)
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(root / "src")})
    assert r.stdout.strip() == (f"traceap.integrations.{module} needs {framework}, which is not "
                                f"installed here: pip install 'traceap[integrations]'"), r.stderr
