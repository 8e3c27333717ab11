"""The paper's benchmark tables on any dataset in the docs/FORMATS.md format (`traceap eval`).

`runner.evaluate` scores every test trace once per window count; `tables` renders the summary
as Markdown/JSON; `plots` draws ROC curves and score timelines; `metrics` wraps scikit-learn.
"""

from .runner import EvalConfig, EvalResult, TraceRecord, evaluate

__all__ = ["EvalConfig", "EvalResult", "TraceRecord", "evaluate"]
