"""Recording real traces with torch.profiler, each anti-pattern switched on by its real cause.

`collect(CollectConfig(...))` records one trace into a dataset (docs/FORMATS.md) with ground truth
from markers; `run_plan(plan)` sweeps models x patterns x batch sizes and resumes.
"""

from .markers import PREFIX as MARKER_PREFIX
from .networks import MODELS, build_model, model_spec
from .causes import GPU_ONLY, PatternUnavailable, parse_patterns
from .plan import Plan, load_plan, run_plan
from .runner import CollectConfig, Recorded, collect, entry_id, job_id

__all__ = ["GPU_ONLY", "MARKER_PREFIX", "MODELS", "CollectConfig", "PatternUnavailable", "Plan",
           "Recorded", "build_model", "collect", "entry_id", "job_id", "load_plan",
           "model_spec", "parse_patterns", "run_plan"]
