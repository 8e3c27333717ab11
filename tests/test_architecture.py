"""The module map of docs/ARCHITECTURE.md, checked: imports only go down the layers.

Every module of `src/traceap` is parsed (no import is executed): `import x`, `from . import x`,
`from ..x import y`, imports inside functions, and module names written as strings for
`importlib.import_module` (the detector and classifier registries).  A package is a top-level
subpackage or module of traceap (`detectors`, `classify`, `idle`, ...).

Two allow-lists name the imports that still break the rules; each entry says what removes it.
They only shrink: an entry that no longer matches an import fails too, so a fixed wall is
not silently left open.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "traceap"

#: The layers of docs/ARCHITECTURE.md, lowest first.  A package may import packages of lower
#: layers only; packages of one layer do not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "units", "progress", "patterns._registry",  # shared vocabulary (OWN_PACKAGES);
     "_auc"),                                        # the one ROC AUC
    ("_torch", "_registry"),                         # the one door to torch (train, collect);
                                                     # classes by name (detectors, classifiers)
    ("trace",),                                      # the columnar Trace
    ("load", "windows"),                             # file -> Trace, Trace -> Windows
    ("manifest", "measures", "outputs"),             # pattern ids; shared trace measurements;
                                                     # the folders and files commands write
    ("idle", "findings", "synth", "collect", "profile"),
    ("report.idle_text",),                           # the idle account in sentences, which
                                                     # the rules' evidence and the notes quote
    ("patterns", "info", "inject"),                  # one module per anti-pattern
    ("parallel",),                                   # one task per trace: processes or Ray
    ("crossrank", "llm", "model"),                   # cross-rank view, LLM I/O, neural model
    ("detectors",),                                  # score windows
    ("classify",),                                   # name the pattern of flagged windows
    ("stages",),                                     # options -> (detector, classifier)
    ("analysis", "eval"),                            # the facade, the tables
    ("job",),                                        # every rank analysed, then compared
    ("diff",),                                       # before/after
    ("report",),                                     # the outputs of analysis, job and diff:
                                                     # above what it shows, so a job or a diff
                                                     # is computed, never written (a job's
                                                     # caller hands it `details=`)
    ("handler", "notebook"),                         # the profiler's handler; analyses that
                                                     # show as their report
    ("integrations",),                               # Lightning and Hugging Face callbacks
    ("cli",),
    ("__main__",),
]

#: Package imports that go up or sideways, each with what would remove it (none today: the
#: parallel engine is handed its users' builders and preloads, it never names them).
ALLOWED_PACKAGE_IMPORTS: dict[tuple[str, str], str] = {}

#: Pattern modules (named by a pattern id) that import another pattern module, with what
#: removes each.  Shared measurements live in `traceap/measures/` (or, when they read the idle
#: account, `traceap.idle`); a rule imports those, never another rule.
ALLOWED_PATTERN_IMPORTS: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _resolve(name: str) -> str:
    """The longest prefix of a dotted name that is a module of traceap."""
    parts = name.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts)


def imports_of(module: str) -> set[str]:
    """The traceap modules `module` imports, wherever in the file the import is."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # `from x import y` imports the module x.y where y is one, else x.
            targets = [f"{origin}.{a.name}" for a in node.names] + [origin]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            targets = [node.value] if node.value.startswith("traceap.") else []
        else:
            continue
        for t in targets:
            if t.startswith("traceap") and (m := _resolve(t)) and m != module:
                found.add(m)
    return found


IMPORTS = {m: imports_of(m) for m in MODULES}


#: Modules that count as packages of their own.  The pattern registry
#: (`traceap/patterns/_registry.py`) sits in the bottom layer: every layer reads the patterns'
#: declarations through it (manifest validates ids, idle maps mechanisms to patterns, inject
#: registers pieces), and it imports nothing of traceap.  It loads the rule modules at the
#: first read, by the names in `traceap.patterns.BUILTIN` and at run time, so no import of it
#: reaches up.  The idle account's sentences (`traceap/report/idle_text.py`) sit just above the
#: account, below the rules: a finding's evidence quotes `cause_split` and the analysis' notes
#: the account's summary, both written where they are measured (`report/__init__.py` imports
#: nothing, so importing it pulls in no other output).
OWN_PACKAGES = ("traceap.patterns._registry", "traceap.report.idle_text")


def package_of(module: str) -> str | None:
    """`traceap.detectors.llm` -> `detectors`; None for the root package."""
    if module in OWN_PACKAGES:
        return module.split(".", 1)[1]
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def package_graph() -> dict[str, set[str]]:
    """Package -> the packages it imports."""
    graph: dict[str, set[str]] = defaultdict(set)
    for m, targets in IMPORTS.items():
        a = package_of(m)
        for t in targets:
            b = package_of(t)
            if a and b and a != b:
                graph[a].add(b)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def without(graph: dict[str, set[str]], allowed) -> dict[str, set[str]]:
    return {a: {b for b in bs if (a, b) not in allowed} for a, bs in graph.items()}


def test_every_package_has_a_layer():
    packages = {package_of(m) for m in MODULES} - {None}
    layered = {p for layer in LAYERS for p in layer}
    assert packages - layered == set(), "add the new package to LAYERS and docs/ARCHITECTURE.md"
    assert layered - packages == set(), "LAYERS names a package that is gone"


def test_no_cycle_between_packages():
    assert cycles(without(package_graph(), ALLOWED_PACKAGE_IMPORTS)) == []


def test_imports_go_down_the_layers():
    layer = {p: i for i, names in enumerate(LAYERS) for p in names}
    wrong = sorted(f"{a} -> {b}" for a, bs in package_graph().items() for b in bs
                   if layer[b] >= layer[a] and (a, b) not in ALLOWED_PACKAGE_IMPORTS)
    assert wrong == [], "imports that go up or sideways (see docs/ARCHITECTURE.md)"


def pattern_graph() -> dict[str, set[str]]:
    """patterns/ module -> the patterns/ modules it imports (short names)."""
    prefix = "traceap.patterns."
    return {m[len(prefix):]: {t[len(prefix):] for t in ts if t.startswith(prefix)}
            for m, ts in IMPORTS.items() if m.startswith(prefix)}


def test_no_cycle_among_pattern_modules():
    assert cycles(pattern_graph()) == []


def test_a_rule_never_imports_another_rule():
    from traceap.patterns import pattern_ids
    rules = set(pattern_ids())
    wrong = sorted(f"{a} -> {b}" for a, bs in pattern_graph().items() for b in bs
                   if a in rules and b in rules and (a, b) not in ALLOWED_PATTERN_IMPORTS)
    assert wrong == [], "shared measurements go to traceap/measures/ or a shared module"


@pytest.mark.parametrize("allowed, graph", [(ALLOWED_PACKAGE_IMPORTS, package_graph),
                                            (ALLOWED_PATTERN_IMPORTS, pattern_graph)])
def test_allow_lists_only_shrink(allowed, graph):
    edges = {(a, b) for a, bs in graph().items() for b in bs}
    assert set(allowed) - edges == set(), "this import is gone: delete its allow-list entry"


def test_the_scan_sees_function_level_and_string_imports():
    # classify/redetect.py imports patterns inside a function; the detector registry names
    # its modules as strings; both must count, or a cycle could hide there.
    assert "traceap.patterns" in IMPORTS["traceap.classify.redetect"]
    assert "traceap.detectors.llm" in IMPORTS["traceap.detectors.registry"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


#: Package imports the layers would allow but the pipeline's shape forbids, with why.
FORBIDDEN_PACKAGE_IMPORTS: dict[tuple[str, str], str] = {
    ("model", "inject"): "the neural model reads datasets through `manifest` and `load` "
                         "(`load.find_traces`), never through the tool that plants patterns",
}


def test_no_forbidden_package_import():
    graph = package_graph()
    found = sorted(f"{a} -> {b}: {why}" for (a, b), why in FORBIDDEN_PACKAGE_IMPORTS.items()
                   if b in graph.get(a, set()))
    assert found == []


#: The modules that belong to a pattern and so may quote its id (docs/ARCHITECTURE.md, "A new
#: anti-pattern"): its rule, its inject mechanism and natural label, its simulator switch (the
#: switch table and the phase that runs its mechanism) and its recorded cause.
PATTERN_OWN = ("patterns/{id}.py", "inject/mechanisms/{id}.py")
SHARED_OWN = ("synth/switches.py", "synth/phases/", "collect/causes.py", "collect/runner.py")
#: Outside those, the only files that quote a pattern id: the built-in list the registry loads,
#: and the idle account, whose mechanisms share their pattern's name.
QUOTING = {"patterns/__init__.py", "idle.py"}


def _quoted_ids(text: str, ids) -> set[str]:
    import re
    return {i for i in ids if re.search(rf"[\"']{i}[\"']", text)}


def test_at_most_two_files_quote_a_pattern_id():
    """Adding a pattern costs its own modules: every other module reads the registry."""
    from traceap.patterns import pattern_ids
    ids = pattern_ids()
    found = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        quoted = _quoted_ids(path.read_text(encoding="utf-8"), ids)
        quoted -= {i for i in quoted if rel in {p.format(id=i) for p in PATTERN_OWN}}
        if quoted and not rel.startswith(SHARED_OWN):
            found[rel] = sorted(quoted)
    assert set(found) <= QUOTING, {k: v for k, v in found.items() if k not in QUOTING}
    assert len(QUOTING) <= 2


def test_the_quote_scan_sees_a_quoted_id():
    assert _quoted_ids('x = "graph_break"  # and \'cpu_bound\'', ["graph_break", "cpu_bound",
                                                                  "no_pin_memory"]) \
        == {"graph_break", "cpu_bound"}


#: `traceap.idle` is the account (the mechanism table, its priority, the assignment of each idle
#: microsecond, its per-window and per-step views); what it measures and what it says live in
#: the layers for those (issue #33 part 3).  Each name: its one home.
MEASURED_FOR_IDLE = {
    "traceap.measures.signals": ("intersect", "subtract", "busy_rows", "busy_per_window"),
    "traceap.measures.gaps": ("gpu_span", "first_batch_start", "idle_gaps", "queued_intervals",
                              "loader_gaps", "leading_gap"),
    "traceap.measures.warmup": ("warmup_intervals", "warmup", "WarmupConfig", "WARMUP_CALLS",
                                "WARMUP_HOST"),
    "traceap.measures.host": ("framework_calls", "host_holes", "python_holes", "unrecorded_host",
                              "HostConfig", "launching_threads", "launches_under",
                              "host_compute_ops", "host_compute", "compiled_graphs", "user_code"),
    "traceap.measures.communication": ("host_late_under_nccl", "host_late_outside_collectives"),
    "traceap.measures.copies": ("sync_costs",),
    "traceap.report.idle_text": ("describe", "launch_bound_note", "cause_split"),
}


def _defined(path: Path) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return out


def test_the_idle_account_measures_and_words_each_have_one_home():
    idle_defines = _defined(MODULES["traceap.idle"])
    for module, names in MEASURED_FOR_IDLE.items():
        assert set(names) <= _defined(MODULES[module]), module
        assert idle_defines & set(names) == set(), f"idle.py defines what {module} owns"
    # ... and no caller reaches them through traceap.idle (no re-export kept alive there).
    moved = {n for names in MEASURED_FOR_IDLE.values() for n in names}
    root = SRC.parent.parent
    wrong = []
    for path in [*SRC.rglob("*.py"), *(root / "tests").glob("*.py"),
                 *(root / "benchmarks").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.ImportFrom) and (node.module or "").endswith("idle")
                    and (node.module == "traceap.idle" or node.level)):
                wrong += [f"{path.name}: {a.name}" for a in node.names if a.name in moved]
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in ("idle", "idle_mod") and node.attr in moved):
                wrong.append(f"{path.name}: idle.{node.attr}")
    assert wrong == []
