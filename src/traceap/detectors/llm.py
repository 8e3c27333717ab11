"""The paper's "pure LLM" baseline detector (Table 3): the LLM itself scores every window.

As in the paper, the trace is cut into five sub-traces (consecutive runs of windows) so that
each fits the model's context, and the model returns one anomaly score per window of a
sub-trace.  A raw sub-trace of a real training run is millions of tokens, far beyond the
paper's GPT-4.1 budget and any small local model, so each window is given as one summary line
(GPU busy, kernels, launch delays, memcpys, NCCL, syncs, heaviest op) from `prompt.summary_line`.
The reply is validated (exactly one number in [0, 1] per window) and retried once; a sub-trace
the model fails on scores 0 and is counted in `failures`, never filled in by the expert rules,
so the baseline stays a pure LLM.  `notes` says how many sub-traces failed, for the
notes of `traceap analyze` and the tables of `traceap eval`; once the server is unreachable the
remaining sub-traces are not sent (they fail with the same reason).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from ..llm.backend import DEFAULT_TIMEOUT_S, Backend, BackendError, backend_from_settings
from ..llm.prompt import AnswerError, parse_scores, score_messages, score_schema
from ..errors import TraceapError
from ..trace import Trace
from ..windows import Windows
from .base import BaseDetector
from .registry import register_detector


class PureLLMDetector(BaseDetector):
    """Window scores straight from an LLM, five sub-traces per trace."""

    name = "llm"

    def __init__(self, backend: Backend | str | None = "auto", *, url: str | None = None,
                 model: str | None = None, api_key: str | None = None, n_subtraces: int = 5,
                 retries: int = 1, threshold: float = 0.5,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        if backend == "auto":
            backend = backend_from_settings(url, model, api_key, timeout_s)
        if backend is None or isinstance(backend, str):
            raise TraceapError("the pure-LLM detector needs a model: pass --llm-url (or set "
                               "TRACEAP_LLM_URL / OPENAI_BASE_URL) or TRACEAP_LLM_MODEL")
        if n_subtraces < 1:
            raise TraceapError("n_subtraces must be at least 1")
        self.backend = backend
        self.n_subtraces = n_subtraces
        self.retries = retries
        self.threshold = threshold
        self.failures: list[str] = []
        self.subtraces = 0
        self.seconds = 0.0
        self.calls = 0
        self._down: str | None = None

    def fit(self, traces: Sequence[Trace], labels: Sequence[int]) -> "PureLLMDetector":
        """Nothing to train: the baseline is the model as it is."""
        return self

    def _score_part(self, windows: Windows, idx: np.ndarray) -> np.ndarray:
        msgs = score_messages(windows, idx)
        schema = score_schema(len(idx))
        max_tokens = 8 * len(idx) + 48
        self.subtraces += 1
        err = self._down or ""
        for attempt in range(self.retries + 1 if not self._down else 0):
            self.calls += 1
            try:
                text = self.backend.complete(msgs, schema, max_tokens)
            except BackendError as exc:
                err = self._down = str(exc)
                break
            try:
                return parse_scores(text, len(idx))
            except AnswerError as exc:
                err = str(exc)
                msgs = msgs[:2] + [
                    {"role": "assistant", "content": text[:2000]},
                    {"role": "user", "content": f"That reply is not valid: {exc}. Answer again "
                                                f"with exactly {len(idx)} numbers in [0, 1]."}]
        self.failures.append(f"windows {int(idx[0])}-{int(idx[-1])}: {err}")
        return np.zeros(len(idx))

    def score_windows(self, windows: Windows) -> np.ndarray:
        """One LLM score in [0, 1] per window (0 where the model gave no valid answer)."""
        t0 = time.perf_counter()
        parts = [p for p in np.array_split(np.arange(windows.n), self.n_subtraces) if len(p)]
        scores = np.concatenate([self._score_part(windows, p) for p in parts])
        self.seconds += time.perf_counter() - t0
        return np.clip(scores, 0.0, 1.0)

    @property
    def notes(self) -> list[str]:
        """One line on the sub-traces the model gave no valid answer for (none: no failure)."""
        if not self.failures:
            return []
        reasons = list(dict.fromkeys(f.split(": ", 1)[-1] for f in self.failures))
        return [f"pure-LLM detector: {len(self.failures)} of {self.subtraces} sub-trace(s) got "
                f"no valid answer and scored 0 ({reasons[0]}"
                + (f"; {len(reasons) - 1} other reason(s)" if len(reasons) > 1 else "") + ")"]


register_detector("llm", PureLLMDetector, built_from_options=True)


__all__ = ["PureLLMDetector"]
