"""Talking to a language model: one small interface, `Backend.complete(messages, schema,
max_tokens) -> str`, and the backends behind it.

- `OpenAIBackend`: any OpenAI-compatible server (vLLM, Ollama, llama.cpp's server, OpenAI),
  through the `openai` client; the answer is constrained with `response_format` json_schema,
  or llama.cpp's json_object + schema, or plain text, whichever the server accepts.
- `LlamaCppBackend`: a local GGUF model in-process with llama-cpp-python (optional extra);
  the schema becomes a llama.cpp grammar.

Used by the LLM classifier (`traceap.classify.llm`) and the pure-LLM detector
(`traceap.detectors.llm`); neither knows the other.
"""

from __future__ import annotations

import os
from typing import Protocol

from ..errors import TraceapError

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
        from .setup import resolve_model
        # Sleeping OpenMP workers (see setup.server_env); read when llama.cpp loads.
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


__all__ = ["DEFAULT_TIMEOUT_S", "Backend", "BackendError", "LlamaCppBackend", "OpenAIBackend",
           "backend_from_settings"]
