"""What `traceap profile` puts first on the command's PYTHONPATH.

`sitecustomize.py` runs in every Python process the command starts (torchrun workers too) and
does nothing unless `TRACEAP_PROFILE` is set; `_traceap_profile_child.py` is the recorder it
installs once torch is imported.  Both use only the standard library and torch, so they work in
any interpreter the command uses, with or without traceap installed there.
"""
