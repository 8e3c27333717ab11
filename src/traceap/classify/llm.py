"""The LLM classifier (paper section 5.6): a language model names the pattern of flagged windows.

Backends share one small interface, `Backend.complete(messages, schema, max_tokens) -> str`:

- `OpenAIBackend`: any OpenAI-compatible server (vLLM, Ollama, llama.cpp's server, OpenAI),
  through the `openai` client; the answer is constrained with `response_format` json_schema,
  or llama.cpp's json_object + schema, or plain text, whichever the server accepts.
- `LlamaCppBackend`: a local GGUF model in-process with llama-cpp-python (optional extra);
  the schema becomes a llama.cpp grammar.
- none: no model; the offline classifier answers (the default of `traceap analyze`).

Every reply is validated (`prompt.parse_answer`), retried once with the error spelled out, and
otherwise replaced by the offline classifier's call for that window.  The fix shown to the user
is always the curated `REGISTRY[pattern].fix` of the pattern the model chose, and the evidence
is the pattern's measured numbers; the model's own words go to `PatternCall.explanation`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..errors import TraceapError
from ..windows import Windows
from .base import PatternCall
from .prompt import Answer, AnswerError, DigestConfig, answer_schema, messages, parse_answer

DEFAULT_TIMEOUT_S = 300.0


class BackendError(TraceapError):
    """The model could not be reached or failed to answer (not a content problem)."""


class Backend(Protocol):
    """Something that completes a chat under a JSON schema."""

    name: str

    def complete(self, messages: list[dict], schema: dict, max_tokens: int) -> str: ...


# -- OpenAI-compatible servers ---------------------------------------------------------------
#: Ways to ask for JSON, strongest first; a server that rejects one gets the next.
_MODES = ("json_schema", "json_object", "text")


class OpenAIBackend:
    """An OpenAI-compatible chat server at `url` (e.g. http://127.0.0.1:8000/v1)."""

    name = "openai"

    def __init__(self, url: str, model: str | None = None, api_key: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, temperature: float = 0.0):
        import openai
        self._openai = openai
        self.url = url
        self.client = openai.OpenAI(base_url=url, api_key=api_key or "sk-no-key-needed",
                                    timeout=timeout_s, max_retries=0)
        self._model = model
        self.temperature = temperature
        self.mode: str | None = None  # the first of _MODES the server accepted

    @property
    def model(self) -> str:
        """The model name; when none was given, the first the server lists."""
        if not self._model:
            try:
                listed = self.client.models.list().data
            except self._openai.OpenAIError as exc:
                raise BackendError(f"{self.url}: cannot list models ({_why(exc)})") from None
            if not listed:
                raise BackendError(f"{self.url}: the server lists no model; pass --llm-model")
            self._model = listed[0].id
        return self._model

    def _response_format(self, mode: str, schema: dict) -> dict | None:
        if mode == "json_schema":
            return {"type": "json_schema",
                    "json_schema": {"name": "answer", "schema": schema, "strict": True}}
        if mode == "json_object":
            return {"type": "json_object", "schema": schema}
        return None

    def complete(self, messages: list[dict], schema: dict, max_tokens: int) -> str:
        """One chat completion; transport failures raise `BackendError`."""
        oa = self._openai
        modes = [self.mode] if self.mode else list(_MODES)
        for i, mode in enumerate(modes):
            kwargs = dict(model=self.model, messages=messages, max_tokens=max_tokens,
                          temperature=self.temperature)
            fmt = self._response_format(mode, schema)
            if fmt is not None:
                kwargs["response_format"] = fmt
            try:
                r = self.client.chat.completions.create(**kwargs)
            except oa.APIStatusError as exc:
                # Servers reject an unknown response_format with 400, 422 or even 500
                # (llama-cpp-python); while negotiating, try the next way of asking for JSON.
                if self.mode is None and i + 1 < len(modes) and exc.status_code not in (401, 403, 404):
                    continue
                raise BackendError(f"{self.url}: request rejected ({_why(exc)})") from None
            except oa.OpenAIError as exc:
                raise BackendError(f"{self.url}: {_why(exc)}") from None
            self.mode = mode
            if not r.choices:
                raise BackendError(f"{self.url}: empty reply")
            return r.choices[0].message.content or ""
        raise BackendError(f"{self.url}: no response format accepted")


def _why(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}"


# -- llama.cpp in-process --------------------------------------------------------------------
class LlamaCppBackend:
    """A local GGUF model run in-process by llama-cpp-python (no server, no network)."""

    name = "llama.cpp"

    def __init__(self, model: str, n_ctx: int = 4096, n_threads: int | None = None,
                 temperature: float = 0.0):
        from ..llm_setup import resolve_model
        # Sleeping OpenMP workers (see llm_setup.server_env); read when llama.cpp loads.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            raise TraceapError("llama-cpp-python is not installed; run scripts/setup_llm.sh "
                               "or use --llm-url with a server") from None
        self.path = resolve_model(model)
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.temperature = temperature
        self._llm = None

    @property
    def llm(self):
        """The loaded model (loaded on first use)."""
        if self._llm is None:
            from llama_cpp import Llama
            self._llm = Llama(model_path=str(self.path), n_ctx=self.n_ctx,
                              n_threads=self.n_threads, verbose=False)
        return self._llm

    def complete(self, messages: list[dict], schema: dict, max_tokens: int) -> str:
        """One chat completion constrained by the schema's grammar."""
        try:
            r = self.llm.create_chat_completion(
                messages=messages, max_tokens=max_tokens, temperature=self.temperature,
                response_format={"type": "json_object", "schema": schema})
        except (ValueError, RuntimeError) as exc:  # e.g. prompt longer than the context
            raise BackendError(f"llama.cpp: {_why(exc)}") from None
        return r["choices"][0]["message"]["content"] or ""


# -- choosing a backend ----------------------------------------------------------------------
def backend_from_settings(url: str | None = None, model: str | None = None,
                          api_key: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                          env: dict | None = None) -> Backend | None:
    """The backend the settings ask for, or None (offline).

    Explicit arguments win over the environment: TRACEAP_LLM_URL, then OPENAI_BASE_URL, set a
    server; TRACEAP_LLM_MODEL names its model, or, without a server, a fetched model
    (`traceap llm fetch`) or a .gguf file to run in-process; OPENAI_API_KEY is the key.
    """
    env = os.environ if env is None else env
    url = url or env.get("TRACEAP_LLM_URL") or env.get("OPENAI_BASE_URL")
    model = model or env.get("TRACEAP_LLM_MODEL")
    api_key = api_key or env.get("OPENAI_API_KEY")
    if url:
        return OpenAIBackend(url, model, api_key, timeout_s)
    if model:
        return LlamaCppBackend(model)
    return None


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


class LLMClassifier:
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


__all__ = ["Backend", "BackendError", "LLMClassifier", "LLMConfig", "LlamaCppBackend",
           "OpenAIBackend", "WindowRecord", "backend_from_settings"]
