"""The LLM classifier (paper section 5.6): a language model names the pattern of flagged windows.

The model is reached through a backend of `traceap.llm.backend` (an OpenAI-compatible server,
or a GGUF model in-process with llama.cpp); with none, the offline classifier answers (the
default of `traceap analyze`).

Every reply is validated (`prompt.parse_answer`), retried once with the error spelled out, and
otherwise replaced by the offline classifier's call for that window.  The fix shown to the user
is always the curated `REGISTRY[pattern].fix` of the pattern the model chose, and the evidence
is the pattern's measured numbers; the model's own words go to `PatternCall.explanation`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import TraceapError
from ..llm.backend import (DEFAULT_TIMEOUT_S, Backend, BackendError, LlamaCppBackend, OpenAIBackend,
                           backend_from_settings)
from ..llm.prompt import Answer, AnswerError, DigestConfig, answer_schema, messages, parse_answer
from ..windows import Windows
from .base import BaseClassifier, PatternCall
from .registry import register_classifier


@dataclass
class WindowRecord:
    """What happened for one window: replies, errors, seconds (for reports and benchmarks)."""

    window: int
    replies: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    source: str = "llm"
    answer: Answer | None = None
    #: the backend was unreachable (said once in the run's notes, not per window)
    backend_down: bool = False


@dataclass(frozen=True)
class LLMConfig:
    """Generation budget and retry policy."""

    max_tokens: int = 256
    retries: int = 1
    digest: DigestConfig = DigestConfig()
    #: The paper's Table 4 setting: the window is known to be anomalous, only its name is
    #: asked ("none" is not an answer).  Off in analysis, where false alarms matter.
    assume_anomalous: bool = False


class LLMClassifier(BaseClassifier):
    """Names flagged windows with an LLM; falls back to the offline classifier per window."""

    name = "llm"

    def __init__(self, backend: Backend | str | None = "auto", *, url: str | None = None,
                 model: str | None = None, api_key: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_tokens: int = 256, retries: int = 1,
                 fallback=None, digest: DigestConfig = DigestConfig(),
                 assume_anomalous: bool = False):
        if backend == "auto":
            backend = backend_from_settings(url, model, api_key, timeout_s)
        elif backend in ("none", None):
            backend = None
        elif isinstance(backend, str):
            raise TraceapError(f"unknown LLM backend {backend!r} (use 'auto', 'none' or an object)")
        self.backend: Backend | None = backend
        self.config = LLMConfig(max_tokens, retries, digest, assume_anomalous)
        if fallback is None:
            from .offline import OfflineClassifier
            fallback = OfflineClassifier()
        self.fallback = fallback
        self.records: list[WindowRecord] = []
        self._down: str | None = None  # set when the backend failed to answer at all

    @classmethod
    def from_env(cls, **options) -> "LLMClassifier":
        """A classifier configured from TRACEAP_LLM_URL / OPENAI_BASE_URL / TRACEAP_LLM_MODEL /
        OPENAI_API_KEY (offline when none is set)."""
        return cls("auto", **options)

    @property
    def describe(self) -> str:
        """Which model answers, in words."""
        b = self.backend
        if b is None:
            return "offline rules (no LLM configured)"
        if isinstance(b, OpenAIBackend):
            return f"{b._model or 'server default model'} at {b.url}"
        if isinstance(b, LlamaCppBackend):
            return f"llama.cpp {b.path.name}"
        return getattr(b, "name", type(b).__name__)

    @property
    def stats(self) -> dict:
        """Counts over all windows classified so far."""
        r = self.records
        return {
            "windows": len(r),
            "answered_by_llm": sum(x.source == "llm" for x in r),
            "retried": sum(len(x.replies) > 1 for x in r),
            "fell_back": sum(x.source != "llm" for x in r),
            "seconds": round(sum(x.seconds for x in r), 3),
            "backend_down": self._down,
        }

    # -- one window ------------------------------------------------------------------------
    def ask(self, windows: Windows, w: int) -> WindowRecord:
        """Ask the model about window w: validate, retry once with the error, or give up."""
        rec = WindowRecord(window=int(w))
        t0 = time.perf_counter()
        if self.backend is None or self._down:
            rec.source = "offline" if self.backend is None else "offline-fallback"
            rec.errors.append(self._down or "no LLM configured")
            rec.backend_down = self._down is not None
            return rec
        allow_none = not self.config.assume_anomalous
        msgs = messages(windows, int(w), self.config.digest, allow_none)
        schema = answer_schema(allow_none)
        for attempt in range(self.config.retries + 1):
            try:
                text = self.backend.complete(msgs, schema, self.config.max_tokens)
            except BackendError as exc:
                # The server is unreachable or broken: stop asking for the rest of this run.
                self._down = str(exc)
                rec.errors.append(str(exc))
                rec.backend_down = True
                break
            rec.replies.append(text)
            try:
                rec.answer = parse_answer(text, allow_none)
                break
            except AnswerError as exc:
                rec.errors.append(f"attempt {attempt + 1}: {exc}")
                msgs = msgs[:2] + [
                    {"role": "assistant", "content": text[:2000]},
                    {"role": "user", "content": f"That reply is not valid: {exc}. Answer again "
                                                "with the JSON object only, using one of the "
                                                "listed pattern ids."}]
        rec.seconds = time.perf_counter() - t0
        rec.source = "llm" if rec.answer is not None else "offline-fallback"
        return rec

    # -- the Classifier protocol -----------------------------------------------------------
    @property
    def notes(self) -> list[str]:
        """How many windows the LLM named, how many the offline rules (and why)."""
        st = self.stats
        return [f"classifier: {self.describe}: {st['answered_by_llm']} of {st['windows']} "
                f"window(s) named by the LLM, {st['fell_back']} by the offline rules"
                + (f" ({st['backend_down']})" if st["backend_down"] else "")]

    def take_state(self) -> dict:
        """The window records gathered since the last call (taken out) and a dead backend."""
        state = {"records": list(self.records), "down": self._down}
        self.records.clear()
        return state

    def give_state(self, state: dict) -> None:
        """Add a worker's records; its dead backend is this run's too."""
        self.records.extend(state.get("records", ()))
        self._down = self._down or state.get("down")

    def classify(self, windows: Windows, window_indices: Sequence[int],
                 scores: np.ndarray) -> list[PatternCall]:
        """One call per flagged window, from the model where its answer is valid."""
        from ..patterns import REGISTRY
        idx = [int(w) for w in window_indices]
        recs = [self.ask(windows, w) for w in idx]
        self.records.extend(recs)
        need = [r.window for r in recs if r.answer is None]
        offline = {c.window: c for c in self.fallback.classify(windows, need, scores)} if need else {}
        calls = []
        for rec in recs:
            a = rec.answer
            if a is None:
                c = offline[rec.window]
                if rec.source == "offline-fallback":
                    c.source = "offline-fallback"
                    # An unreachable server is one fact about the run (`stats`, the notes),
                    # not something to repeat under every finding.
                    if not rec.backend_down:
                        c.explanation = (f"LLM answer unusable ({rec.errors[-1]}); offline "
                                         f"rules: " + c.explanation)
                calls.append(c)
                continue
            if a.false_alarm or a.pattern not in REGISTRY:
                calls.append(PatternCall(window=rec.window, pattern=None,
                                         confidence=round(a.confidence, 4), evidence="", fix="",
                                         false_alarm=True, explanation=a.evidence, source="llm"))
                continue
            pat = REGISTRY[a.pattern]
            ev = pat.evidence(windows, [rec.window])
            calls.append(PatternCall(window=rec.window, pattern=pat.id,
                                     confidence=round(a.confidence, 4), evidence=ev.text,
                                     fix=pat.fix, explanation=a.evidence, source="llm"))
        return calls


register_classifier("llm", LLMClassifier)


__all__ = ["LLMClassifier", "LLMConfig", "WindowRecord"]
