"""`traceap profile -- CMD...`: profile an unchanged training or inference command.

    from traceap.profile import ProfileConfig, run
    r = run(["python", "train.py", "--lr", "0.1"], ProfileConfig(out=Path("prof"), steps=3))
    r.exit_code, r.traces          # the command's own exit code; one trace per rank

`runner.py` runs the command and gathers what it recorded; `bootstrap/` is what every Python
process of the command loads to record itself (see its docstrings for how steps are found).
"""

from .runner import (BOOTSTRAP, DEFAULT_PERIOD_S, DEFAULT_SKIP, DEFAULT_STEPS, ProfileConfig,
                     ProfileRun, default_out, describe, run)

__all__ = ["BOOTSTRAP", "DEFAULT_PERIOD_S", "DEFAULT_SKIP", "DEFAULT_STEPS", "ProfileConfig",
           "ProfileRun", "default_out", "describe", "run"]
