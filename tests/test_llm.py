"""The LLM stage: prompt digest, answer validation, backends, fallback, re-detection, pure-LLM
baseline, model fetching.

The server tests start a real llama.cpp OpenAI-compatible server (`python -m llama_cpp.server`)
on 127.0.0.1 with the smallest packaged model (SmolLM2-135M); they check the plumbing, the
JSON validation, the retry and the fallback, not the model's wisdom.  They skip, saying why,
where llama-cpp-python or the model is absent (scripts/setup_llm.sh installs both; CI runs it).
"""

from __future__ import annotations

import hashlib
import json
import time
import zipfile

import numpy as np
import pytest

from traceap.classify.base import PatternCall
from traceap.classify.llm import LLMClassifier
from traceap.classify.offline import OfflineClassifier
from traceap.llm.backend import BackendError, OpenAIBackend, backend_from_settings
from traceap.llm.prompt import (ANSWER_SCHEMA, AnswerError, DigestConfig, answer_schema, digest,
                                messages, parse_answer, parse_scores, score_messages,
                                system_prompt)
from traceap.classify.redetect import RedetectConfig, RedetectingClassifier, redetect
from traceap.patterns import pattern_ids
from traceap.detectors.registry import make_detector
from traceap.llm.setup import (LLMSetupError, ModelSpec, assemble, free_port, have_llama_server,
                               model_path, running_server)
from traceap.patterns import REGISTRY
from traceap.windows import Windows

PATTERNS = pattern_ids()  # the built-in pattern ids, in report order


@pytest.fixture(scope="module")
def windows(readme_sample):
    return Windows(readme_sample, 100)


@pytest.fixture(scope="module")
def flagged(windows):
    """Windows the expert detector flags in the README sample, strongest first."""
    s = make_detector("expert").score_windows(windows)
    idx = np.flatnonzero(s >= 0.5)
    assert len(idx) >= 3
    return idx[np.argsort(-s[idx], kind="stable")], s


def _valid(pattern="no_pin_memory", **kw) -> str:
    obj = {"evidence": "12 pageable HtoD copies", "pattern": pattern, "confidence": 0.8,
           "false_alarm": False, "fix": "pin memory"} | kw
    return json.dumps(obj)


# -- the digest ------------------------------------------------------------------------------
def test_digest_keeps_what_tells_patterns_apart(windows):
    s = windows.stats
    w_nccl = int(np.argmax(s["n_nccl"]))
    d = digest(windows, w_nccl)
    assert f"Window {w_nccl} of 100" in d
    assert "NCCL kernels" in d and "on streams" in d and "overlapped by compute" in d
    assert "Top kernels" in d and "launch delay" in d
    assert f"Window {w_nccl - 1} (before)" in d and f"Window {w_nccl + 1} (after)" in d
    w_copy = int(np.argmax(s["n_memcpy"]))
    d = digest(windows, w_copy)
    assert "Memcpys (" in d and "DTOD from device" in d and "host blocked" in d


def test_digest_fits_a_small_context(windows, flagged):
    idx, _ = flagged
    # 4 characters per token is generous for this text; the system prompt is about 600 tokens.
    longest = max(len(digest(windows, int(w))) for w in idx)
    assert longest < 6000
    m = messages(windows, int(idx[0]))
    assert m[0]["role"] == "system" and all(p in m[0]["content"] for p in PATTERNS)


def test_score_messages_list_every_window_of_the_subtrace(windows):
    m = score_messages(windows, np.arange(20, 40))
    text = m[1]["content"]
    assert "window 20 " in text and "window 39 " in text and "window 40 " not in text
    assert "exactly 20 scores" in text


# -- validating answers ----------------------------------------------------------------------
def test_parse_answer_accepts_valid_and_tolerant_forms():
    a = parse_answer(_valid())
    assert (a.pattern, a.confidence, a.false_alarm) == ("no_pin_memory", 0.8, False)
    fenced = "Sure!\n```json\n" + _valid("CPU bound", confidence=85) + "\n```"
    a = parse_answer(fenced)
    assert a.pattern == "cpu_bound" and a.confidence == pytest.approx(0.85)
    a = parse_answer(_valid("none", false_alarm="false"))
    assert a.pattern == "none" and a.false_alarm  # "none" always means a false alarm


def test_known_anomalous_mode_refuses_none():
    assert parse_answer(_valid("none", false_alarm=True)).false_alarm
    with pytest.raises(AnswerError, match="unknown pattern"):
        parse_answer(_valid("none"), allow_none=False)
    assert "none" not in answer_schema(False)["properties"]["pattern"]["enum"]
    assert "known to contain" in system_prompt(False) and '"none"' not in system_prompt(False)
    assert '"none"' in system_prompt(True)


@pytest.mark.parametrize("reply, why", [
    ("I think it is cpu bound.", "no JSON"),
    ('{"evidence": "x", "pattern": "cpu_bound", "confid', "not valid JSON"),
    (_valid("slow_gpu"), "unknown pattern"),
    (_valid(confidence=1.7e3), "outside"),
    (_valid(confidence="high"), "must be a number"),
    (_valid(false_alarm="maybe"), "true or false"),
    ('{"pattern": "cpu_bound"}', "missing field"),
])
def test_parse_answer_rejects_with_a_reason(reply, why):
    with pytest.raises(AnswerError, match=why):
        parse_answer(reply)


def test_parse_scores():
    assert parse_scores('{"scores": [0, 0.5, 1]}', 3).tolist() == [0, 0.5, 1]
    assert parse_scores('{"scores": [10, 50, 100]}', 3).tolist() == [0.1, 0.5, 1.0]
    with pytest.raises(AnswerError, match="3 scores"):
        parse_scores('{"scores": [0.1, 0.2]}', 3)
    with pytest.raises(AnswerError, match="numbers"):
        parse_scores('{"scores": ["a", 0.2, 0.3]}', 3)


def test_answer_schema_lists_exactly_the_eight_patterns_and_none():
    assert ANSWER_SCHEMA["properties"]["pattern"]["enum"] == [*PATTERNS, "none"]
    assert set(ANSWER_SCHEMA["required"]) == {"pattern", "confidence", "evidence", "fix",
                                              "false_alarm"}


# -- choosing a backend ----------------------------------------------------------------------
def test_backend_settings_precedence():
    env = {"TRACEAP_LLM_URL": "http://127.0.0.1:1/v1", "OPENAI_BASE_URL": "http://other/v1",
           "TRACEAP_LLM_MODEL": "m1", "OPENAI_API_KEY": "k"}
    b = backend_from_settings(env=env)
    assert isinstance(b, OpenAIBackend) and b.url == "http://127.0.0.1:1/v1" and b.model == "m1"
    b = backend_from_settings(url="http://127.0.0.1:2/v1", model="m2", env=env)
    assert b.url == "http://127.0.0.1:2/v1" and b.model == "m2"
    b = backend_from_settings(env={"OPENAI_BASE_URL": "http://127.0.0.1:3/v1"})
    assert b.url == "http://127.0.0.1:3/v1"
    assert backend_from_settings(env={}) is None


def test_without_a_model_the_offline_classifier_answers(windows, flagged):
    idx, s = flagged
    idx = idx[:5].tolist()
    got = LLMClassifier("none").classify(windows, idx, s)
    want = OfflineClassifier().classify(windows, idx, s)
    assert [(c.window, c.pattern, c.source) for c in got] == \
           [(c.window, c.pattern, c.source) for c in want]


def test_refused_connection_falls_back_to_offline_quickly(windows, flagged):
    idx, s = flagged
    idx = idx[:4].tolist()
    clf = LLMClassifier(OpenAIBackend(f"http://127.0.0.1:{free_port()}/v1", "any", timeout_s=5))
    t0 = time.perf_counter()
    calls = clf.classify(windows, idx, s)
    assert time.perf_counter() - t0 < 10
    offline = {c.window: c for c in OfflineClassifier().classify(windows, idx, s)}
    assert [c.window for c in calls] == idx
    for c in calls:
        assert c.source == "offline-fallback"
        assert c.pattern == offline[c.window].pattern
        # the unreachable server is one fact of the run (stats, notes), not per window
        assert c.explanation == offline[c.window].explanation
    assert "Connection" in clf.stats["backend_down"]
    # Once the server is down, later windows do not wait for it again.
    assert sum(len(r.errors) for r in clf.records) == len(idx)


# -- re-detection ----------------------------------------------------------------------------
def test_redetect_reexamines_false_alarms_at_finer_scales(windows, flagged):
    idx, s = flagged
    det = make_detector("expert")
    # A strict classifier calls weakly matching windows false alarms; the same rules at half
    # the window width then find a pattern in a sub-window, or dismiss it.
    strict = OfflineClassifier(min_score=0.9)
    calls = strict.classify(windows, idx.tolist(), s)
    doubtful = {c.window for c in calls if c.false_alarm}
    assert doubtful
    new, changes = redetect(windows, calls, det, OfflineClassifier(), threshold=0.5,
                            config=RedetectConfig(max_rounds=2))
    assert [c.window for c in new] == [c.window for c in calls]
    assert {c.window for c in changes} == doubtful
    by_window = {c.window: c for c in new}
    for ch in changes:
        c = by_window[ch.window]
        assert ch.outcome in ("found", "dismissed", "unresolved") and ch.rounds
        if ch.outcome == "found":
            assert c.pattern == ch.pattern and not c.false_alarm
            assert c.fix == REGISTRY[c.pattern].fix and c.explanation.startswith("re-detected")
            assert "windows" in ch.text
        else:
            assert c.false_alarm and c.pattern is None
    assert any(ch.outcome == "found" for ch in changes)
    # Calls that were not false alarms are untouched.
    for old, c in zip(calls, new):
        if not old.false_alarm:
            assert c is old


def test_redetect_rounds_are_bounded(windows, flagged):
    idx, s = flagged
    det = make_detector("expert")
    calls = [PatternCall(window=int(w), pattern=None, confidence=1.0, evidence="", fix="",
                         false_alarm=True) for w in idx[:5]]

    class NeverSure:  # a classifier that never names anything: every round stays unresolved
        name = "never"

        def classify(self, windows, window_indices, scores):
            return [PatternCall(int(w), None, 1.0, "", "", True) for w in window_indices]

    new, changes = redetect(windows, calls, det, NeverSure(), 0.5, RedetectConfig(max_rounds=3))
    assert all(c.false_alarm for c in new)
    assert all(len(ch.rounds) <= 3 for ch in changes)
    assert all(ch.outcome in ("dismissed", "unresolved") for ch in changes)
    assert any(ch.outcome == "unresolved" and len(ch.rounds) == 3 for ch in changes)


def test_redetecting_classifier_plugs_into_analyze(readme_sample):
    from traceap.analysis import analyze
    det = make_detector("expert")
    clf = RedetectingClassifier(OfflineClassifier(min_score=0.9), det)
    a = analyze(readme_sample, 100, det, clf)
    assert clf.changes and len(clf.notes) == len(clf.changes)
    found = {ch.window for ch in clf.changes if ch.outcome == "found"}
    named = {w.index for w in a.windows if w.pattern}
    assert found <= named


# -- fetching models -------------------------------------------------------------------------
def _chunked_spec(tmp_path, payload: bytes, n: int):
    parts = [payload[k * len(payload) // n:(k + 1) * len(payload) // n] for k in range(n)]
    chunks = []
    for k, part in enumerate(parts, 1):
        pkg = f"fake_part{k}"
        with zipfile.ZipFile(tmp_path / f"fake_part{k}-1.0-py3-none-any.whl", "w") as z:
            z.writestr(f"{pkg}/data/part{k:02d}.bin", part)
        chunks.append((f"fake-part{k}", "1.0", f"{pkg}/data/part{k:02d}.bin"))
    return ModelSpec(name="fake", description="", filename="fake.gguf", chunks=tuple(chunks),
                     size=len(payload), sha256=hashlib.sha256(payload).hexdigest())


def test_assemble_joins_chunks_in_order_and_checks_sha256(tmp_path):
    payload = bytes(np.random.default_rng(0).integers(0, 256, 30_000, dtype=np.uint8))
    spec = _chunked_spec(tmp_path, payload, 3)
    out = assemble(spec, tmp_path, tmp_path / "models" / "fake.gguf")
    assert out.read_bytes() == payload
    bad = ModelSpec(**{**spec.__dict__, "sha256": "0" * 64})
    with pytest.raises(LLMSetupError, match="sha256"):
        assemble(bad, tmp_path, tmp_path / "models2" / "fake.gguf")
    assert not (tmp_path / "models2" / "fake.gguf").exists()  # nothing half-checked is kept


# -- against a real llama.cpp server ---------------------------------------------------------
needs_server = pytest.mark.skipif(
    not have_llama_server() or model_path("smollm2") is None,
    reason="llama-cpp-python[server] or the smollm2 model is absent "
           "(run: bash scripts/setup_llm.sh)")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    log = tmp_path_factory.mktemp("llm") / "server.log"
    with running_server("smollm2", threads=2, log_path=log) as url:
        yield url


@needs_server
def test_server_answers_are_validated_and_fixes_are_curated(server_url, windows, flagged):
    idx, s = flagged
    idx = idx[:1].tolist()
    backend = OpenAIBackend(server_url)
    compact = DigestConfig(top_kernels=2, top_cpu_ops=2, top_annotations=2, neighbours=0)
    clf = LLMClassifier(backend, max_tokens=256, digest=compact)
    calls = clf.classify(windows, idx, s)
    # llama-cpp-python's server takes json_object + schema (a grammar), not json_schema.
    assert backend.mode == "json_object"
    assert backend.model == "smollm2"
    assert [c.window for c in calls] == idx
    assert clf.stats["answered_by_llm"] >= 1
    for c, rec in zip(calls, clf.records):
        assert rec.replies, "the server was asked"
        if c.source == "llm":
            answer = parse_answer(rec.replies[-1])
            assert c.confidence == pytest.approx(answer.confidence, abs=1e-4)
            assert c.explanation == answer.evidence
            if c.pattern is None:
                assert c.false_alarm and c.fix == ""
            else:
                # The fix and evidence shown come from the curated rules, not the model.
                assert c.fix == REGISTRY[c.pattern].fix
                assert c.evidence == REGISTRY[c.pattern].evidence(windows, [c.window]).text
        else:
            assert c.source == "offline-fallback" and len(rec.replies) == 2


@needs_server
def test_truncated_answer_is_retried_once_then_replaced_by_offline(server_url, windows, flagged):
    idx, s = flagged
    idx = idx[:1].tolist()
    compact = DigestConfig(top_kernels=2, top_cpu_ops=2, top_annotations=2, neighbours=0)
    clf = LLMClassifier(OpenAIBackend(server_url), max_tokens=5, digest=compact)
    calls = clf.classify(windows, idx, s)
    rec = clf.records[0]
    assert len(rec.replies) == 2  # first try and one retry, no more
    assert all("not valid JSON" in e or "no JSON" in e for e in rec.errors)
    want = OfflineClassifier().classify(windows, idx, s)[0]
    assert calls[0].source == "offline-fallback" and calls[0].pattern == want.pattern
    assert calls[0].fix == want.fix


@needs_server
def test_pure_llm_detector_scores_every_window(server_url, readme_sample):
    from traceap.detectors.llm import PureLLMDetector
    w10 = Windows(readme_sample, 10)
    det = PureLLMDetector(url=server_url)
    s = det.score_windows(w10)
    assert s.shape == (10,) and np.all((s >= 0) & (s <= 1))
    # Five sub-traces, each asked once and retried at most once.
    assert 5 <= det.calls <= 10
    assert len(det.failures) <= 5
    assert det.fit([], []) is det


def test_pure_llm_detector_needs_a_model(monkeypatch):
    from traceap.errors import TraceapError
    for var in ("TRACEAP_LLM_URL", "OPENAI_BASE_URL", "TRACEAP_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(TraceapError, match="needs a model"):
        make_detector("llm")


def test_unreachable_server_is_a_backend_error():
    b = OpenAIBackend(f"http://127.0.0.1:{free_port()}/v1", "m", timeout_s=3)
    with pytest.raises(BackendError):
        b.complete([{"role": "user", "content": "hi"}], ANSWER_SCHEMA, 8)


needs_llama = pytest.mark.skipif(
    not have_llama_server() or model_path("smollm2") is None,
    reason="llama-cpp-python or the smollm2 model is absent (run: bash scripts/setup_llm.sh)")


@needs_llama
def test_in_process_llama_cpp_backend_from_the_environment(monkeypatch):
    from traceap.llm.backend import LlamaCppBackend
    for var in ("TRACEAP_LLM_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRACEAP_LLM_MODEL", "smollm2")
    clf = LLMClassifier.from_env()
    assert isinstance(clf.backend, LlamaCppBackend) and clf.backend.path.name.startswith("SmolLM2")
    # The schema becomes a grammar: even a 135M model can only answer in that shape.
    schema = {"type": "object", "properties": {"slow": {"type": "boolean"}},
              "required": ["slow"], "additionalProperties": False}
    text = clf.backend.complete([{"role": "user", "content": "Is a GPU idle 90% of the time "
                                  "slow? Answer in JSON."}], schema, 24)
    assert isinstance(json.loads(text)["slow"], bool)


def test_analyze_cli_with_an_unreachable_llm_says_so_and_still_reports(readme_sample):
    from typer.testing import CliRunner
    from traceap.cli import app
    from tests.conftest import SAMPLE
    url = f"http://127.0.0.1:{free_port()}/v1"
    r = CliRunner().invoke(app, ["analyze", str(SAMPLE), "--detector", "expert", "--classifier",
                                 "llm", "--llm-url", url, "--llm-model", "m", "--redetect", "1"])
    assert r.exit_code == 0, r.output
    assert "by the offline rules" in r.output
    # noted once, in the notes; not under every finding
    assert r.output.count("APIConnectionError") == 1, r.output
    r = CliRunner().invoke(app, ["analyze", str(SAMPLE), "--llm-url", url])
    assert r.exit_code != 0 and "go with --classifier llm" in str(r.exception)


class _Garbled:
    """A backend that answers, but never with valid scores for some sub-traces."""

    name = "garbled"

    def __init__(self, bad_parts: int):
        self.bad_parts = bad_parts
        self.asked = 0

    def complete(self, messages, schema, max_tokens):
        self.asked += 1
        n = schema["properties"]["scores"]["minItems"] if "properties" in schema else 0
        if (self.asked + 1) // 2 <= self.bad_parts:   # each bad sub-trace is asked twice
            return "I think these windows look fine."
        return json.dumps({"scores": [0.9] * n})


def test_pure_llm_failures_are_counted_and_said(windows):
    from traceap.detectors.llm import PureLLMDetector
    det = PureLLMDetector(_Garbled(bad_parts=2))
    s = det.score_windows(windows)
    assert s.shape == (100,)
    assert det.subtraces == 5 and len(det.failures) == 2
    assert np.all(s[:40] == 0) and np.all(s[40:] == 0.9)   # the failed ones scored 0, not filled in
    note = det.failure_note()
    assert note.startswith("pure-LLM detector: 2 of 5 sub-trace(s) got no valid answer and scored 0")
    assert PureLLMDetector(_Garbled(bad_parts=0)).failure_note() is None


def test_pure_llm_unreachable_is_asked_once_and_reported_by_analyze(readme_sample):
    from typer.testing import CliRunner
    from traceap.cli import app
    from tests.conftest import SAMPLE
    url = f"http://127.0.0.1:{free_port()}/v1"
    r = CliRunner().invoke(app, ["analyze", str(SAMPLE), "--detector", "llm", "--llm-url", url,
                                 "--llm-model", "m", "--windows", "20"])
    assert r.exit_code == 0, r.output
    assert "pure-LLM detector: 5 of 5 sub-trace(s) got no valid answer and scored 0" in r.output
    assert r.output.count("APIConnectionError") == 1, r.output
