"""traceap leaves the user's torch alone: reading, analysing and comparing traces never import it,
a missing torch is one line for the commands that need it, and pyproject admits a range of
releases rather than one pin (issue #36, item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from traceap._torch import TORCH_MIN, release_of, torch_requirement

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "dlrm_a100_rank3.json.gz"

#: Makes `import torch` fail as it does where torch is not installed (the shared venv keeps its).
NO_TORCH = textwrap.dedent("""
    import sys
    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError("No module named 'torch'", name="torch")
    sys.meta_path.insert(0, NoTorch())
""")

#: Runs each command line in one interpreter and says after which one torch was first imported.
WHICH_IMPORT_TORCH = textwrap.dedent("""
    import json, sys
    import traceap
    seen = {"import traceap": "torch" in sys.modules}
    from traceap.cli import app
    for args in json.loads(sys.argv[1]):
        try:
            app(args, standalone_mode=False)
        except SystemExit:
            pass
        seen[" ".join(args)] = "torch" in sys.modules
    print(json.dumps(seen))
""")


def _python(code: str, *args: str, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRACEAP_CACHE": str(tmp / "cache")}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, cwd=tmp, timeout=300)


def test_import_info_analyze_and_diff_never_import_torch(tmp_path):
    import json

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    runs = [["info", str(SAMPLE)],
            ["analyze", str(SAMPLE), "--detector", "expert", "--json", str(a)],   # rules only
            ["analyze", str(SAMPLE), "--json", str(b)],      # the default: the model, in numpy
            *(["analyze", str(SAMPLE), "--detector", d, "--json", str(tmp_path / f"{d}.json")]
              for d in ("rule", "clustering", "model")),
            ["diff", str(a), str(b)]]
    r = _python(WHICH_IMPORT_TORCH, json.dumps(runs), tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert a.is_file() and b.is_file()
    assert not any(seen.values()), f"torch imported by: {[k for k, v in seen.items() if v]}"


def test_without_torch_analyze_works_and_train_is_one_line_exit_2(tmp_path):
    out = tmp_path / "a.json"
    cli = "import runpy, sys; sys.argv = ['traceap'] + sys.argv[1:]; " \
          "runpy.run_module('traceap', run_name='__main__')"
    r = _python(NO_TORCH + cli, "analyze", str(SAMPLE), "--json", str(out), tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert out.is_file()
    (tmp_path / "ds").mkdir()
    r = _python(NO_TORCH + cli, "train", "--dataset", str(tmp_path / "ds"),
                "--out", str(tmp_path / "m.pt"), tmp=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"traceap: error: traceap train needs torch, which is not installed here: pip install "
        f"'{torch_requirement()}' (analyze, info and diff work without it)"]
    assert not (tmp_path / "m.pt").exists()


def test_pyproject_admits_a_range_of_torch_releases_from_the_tested_oldest():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch,) = [Requirement(d) for d in deps if Requirement(d).name == "torch"]
    assert str(torch.specifier) == f">={TORCH_MIN[0]}.{TORCH_MIN[1]}", \
        "pyproject's torch floor and traceap._torch.TORCH_MIN must say the same"
    # the oldest tested, the two newest minor releases when this was written (2.14, 2.15), a
    # nightly and a vendor build
    for version in ("2.6.0", "2.12.0", "2.13.0", "2.14.1", "2.15.0", "2.16.0.dev20261201",
                    "2.13.0a0"):
        assert torch.specifier.contains(version, prereleases=True), version
    assert not torch.specifier.contains("2.5.1")


def test_release_of_reads_nightlies_and_vendor_builds():
    assert release_of("2.14.0.dev20261201+cpu") == (2, 14)
    assert release_of("2.13.0a0+git1234abc") == (2, 13)
    assert release_of("unknown") is None


def test_import_and_the_notebook_entry_point_import_no_torch_nor_frameworks(tmp_path):
    """`import traceap`, `traceap.trace_handler` (made, not called) and `traceap.analyze` with
    its inline report import neither torch nor the callbacks' frameworks (issue #36)."""
    code = textwrap.dedent(f"""
        import sys
        import traceap
        traceap.trace_handler("{tmp_path / 'traces'}")
        html = traceap.analyze("{SAMPLE}")._repr_html_()
        heavy = ("torch", "lightning", "pytorch_lightning", "transformers")
        print(sorted(m for m in heavy if m in sys.modules), len(html) > 1000)
    """)
    r = _python(code, tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[] True"
