"""What the LLM reads and what it must answer (paper section 5.6).

A flagged window holds thousands of events; a small model has a 4k-token context.  The digest
keeps what distinguishes the eight anti-patterns: the heaviest kernels and CPU ops with their
durations and launch delays, GPU idle gaps, memcpys by direction and memory kind with sizes,
synchronising calls, NCCL kernels with their streams and overlap with compute, annotations
(DataLoader, torch.compile markers, ProfilerStep), and a one-line summary of the neighbouring
windows for contrast.  The answer is JSON constrained by `answer_schema` and checked by
`parse_answer`; anything else is an `AnswerError`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from ..patterns import pattern_ids, patterns
from ..trace import CopyKind, Kind, MemKind
from ..units import fmt_us
from ..windows import Windows

NONE = "none"

def signatures() -> dict[str, str]:
    """Every registered anti-pattern as the model is told it: what each looks like in a
    window (`AntiPattern.signature`)."""
    return {p.id: p.signature for p in patterns()}


_FIELDS = (
    "Reply with one JSON object with these fields, in this order: "
    '"evidence": the two or three numbers or event names in the window that decide it; '
    '"pattern": {choices}; "confidence": a number from 0 to 1; '
    '"false_alarm": {false_alarm}; "fix": one short sentence on how to fix it.'
)


def system_prompt(allow_none: bool = True) -> str:
    """The system prompt: the task, the eight signatures, the answer's fields.

    With `allow_none=False` (the paper's Table 4 setting) the model is told the window holds
    one of the anti-patterns and must name it.
    """
    head = ("You are an expert in PyTorch performance. You read a digest of one time window of "
            "a PyTorch profiler (Kineto) trace and name the performance anti-pattern it shows. "
            "The anti-patterns and their signatures:\n"
            + "\n".join(f"- {p}: {s}" for p, s in signatures().items()) + "\n")
    if allow_none:
        return head + ("If the window shows none of them (a busy GPU doing normal work), use "
                       'pattern "none" and false_alarm true.\n') + _FIELDS.format(
            choices='one of the ids above, or "none"',
            false_alarm="true if the window shows no anti-pattern, else false")
    return head + "The window is known to contain one of these anti-patterns.\n" + \
        _FIELDS.format(choices="one of the ids above", false_alarm="false")


def answer_schema(allow_none: bool = True) -> dict:
    """JSON schema of the answer (evidence first, so a small model states facts before it
    chooses; string lengths bounded so a rambling model still closes the object)."""
    return {
        "type": "object",
        "properties": {
            "evidence": {"type": "string", "maxLength": 300},
            "pattern": {"type": "string", "enum": [*pattern_ids(), NONE] if allow_none else [*pattern_ids()]},
            "confidence": {"type": "number"},
            "false_alarm": {"type": "boolean"},
            "fix": {"type": "string", "maxLength": 160},
        },
        "required": ["evidence", "pattern", "confidence", "false_alarm", "fix"],
        "additionalProperties": False,
    }


ANSWER_SCHEMA: dict = answer_schema(True)


class AnswerError(ValueError):
    """The model's reply is not a valid answer (not JSON, unknown pattern, bad field)."""


@dataclass
class Answer:
    """A validated answer for one window."""

    pattern: str            # a registered pattern id, or "none"
    confidence: float       # in [0, 1]
    evidence: str
    fix: str
    false_alarm: bool


@dataclass(frozen=True)
class DigestConfig:
    """How much of a window the digest keeps (sized for a 4k-token context)."""

    top_kernels: int = 4
    top_cpu_ops: int = 5
    top_annotations: int = 4
    max_name: int = 60
    neighbours: int = 1


# -- the digest ------------------------------------------------------------------------------
def _us(us: float) -> str:
    return fmt_us(us, fine=True)  # the digest's durations: one digit more, no spaces


def _mb(b: float) -> str:
    return f"{b / 1e6:.2f}MB" if b >= 1e5 else f"{b / 1e3:.1f}KB"


def _short(name: str, n: int) -> str:
    name = " ".join(name.split())
    return name if len(name) <= n else name[: n - 3] + "..."


def _clipped(windows: Windows, w: int, rows: np.ndarray) -> np.ndarray:
    """Time of each row inside window w."""
    t = windows.trace
    a, b = windows.edges[w], windows.edges[w + 1]
    return np.clip(np.minimum(t.end[rows], b) - np.maximum(t.ts[rows], a), 0.0, None)


def _by_name(windows: Windows, rows: np.ndarray, time: np.ndarray, k: int):
    """Top-k names among rows by time: (code, count, time, row indices mask)."""
    t = windows.trace
    if not len(rows):
        return []
    codes, inv = np.unique(t.name[rows], return_inverse=True)
    tot = np.bincount(inv, weights=time)
    cnt = np.bincount(inv)
    order = np.argsort(-tot)[:k]
    return [(int(codes[i]), int(cnt[i]), float(tot[i]), inv == i) for i in order]


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from ..trace import merged_intervals
    return merged_intervals(np.asarray(starts, float), np.asarray(ends, float))


def _overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Time covered by both unions of intervals."""
    def size(s, e):
        return float(np.sum(e - s)) if len(s) else 0.0
    ua, ub = _union(*a), _union(*b)
    both = _union(np.concatenate((ua[0], ub[0])), np.concatenate((ua[1], ub[1])))
    return max(size(*ua) + size(*ub) - size(*both), 0.0)


def _idle_gaps(windows: Windows, w: int) -> tuple[int, float, float]:
    """(number of GPU idle gaps over 10 us, longest, total idle) inside window w."""
    t = windows.trace
    a, b = windows.edges[w], windows.edges[w + 1]
    rows = windows.rows_in(w, Kind.KERNEL, Kind.GPU_MEMCPY, Kind.GPU_MEMSET)
    s, e = _union(np.clip(t.ts[rows], a, b), np.clip(t.end[rows], a, b))
    bounds_s = np.concatenate(([a], e))
    bounds_e = np.concatenate((s, [b]))
    gaps = np.clip(bounds_e - bounds_s, 0.0, None)
    big = gaps[gaps > 10.0]
    return int(len(big)), float(big.max()) if len(big) else 0.0, float(gaps.sum())


_LOADER = re.compile(r"DataLoader.*__next__|dataloader\.py\(\d+\): __next__")
_SINGLE = re.compile(r"_SingleProcessDataLoaderIter")
_COMPILE = re.compile(r"Torch-Compiled Region|CompiledFunction|TorchDynamo Cache Lookup")
_TRITON = re.compile(r"^triton_")


def _named(windows: Windows, rows: np.ndarray, rx: re.Pattern) -> np.ndarray:
    """Rows whose name matches `rx` (the regex runs once per distinct name)."""
    if not len(rows):
        return rows
    t = windows.trace
    codes, inv = np.unique(t.name[rows], return_inverse=True)
    hit = np.fromiter((bool(rx.search(t.names[c])) for c in codes), dtype=bool, count=len(codes))
    return rows[hit[inv]]


def key_facts(windows: Windows, w: int) -> list[str]:
    """The measurements the eight signatures speak of, one line each, for window w."""
    t = windows.trace
    width = windows.width_us
    pct = lambda x: f"{100 * x / width:.0f}% of the window"  # noqa: E731
    host = windows.rows_in(w, Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION)
    out = []
    loader = _named(windows, host, _LOADER)
    if len(loader):
        kind = "single-process" if len(_named(windows, loader, _SINGLE)) else "multi-process"
        out.append(f"DataLoader __next__ ({kind}): {len(loader)}x, "
                   f"{pct(_clipped(windows, w, loader).sum())}")
    else:
        out.append("DataLoader __next__: none")
    mc = windows.rows_in(w, Kind.GPU_MEMCPY)
    h2d = mc[t.copy_kind[mc] == CopyKind.HTOD]
    d2h = mc[t.copy_kind[mc] == CopyKind.DTOH]
    pageable = h2d[t.copy_src[h2d] == MemKind.PAGEABLE]
    rt = windows.rows_in(w, Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER)
    sync = rt[t.is_sync[rt]]
    out.append(f"Memcpy: HtoD {len(h2d)} ({len(pageable)} from pageable memory), DtoH "
               f"{len(d2h)}, {_mb(float(np.nansum(t.bytes[mc])))}, copies take "
               f"{pct(_clipped(windows, w, mc).sum())}; sync calls {len(sync)} taking "
               f"{pct(_clipped(windows, w, sync).sum())}")
    comp = _named(windows, host, _COMPILE)
    kernels = windows.rows_in(w, Kind.KERNEL)
    triton = _named(windows, kernels, _TRITON)
    out.append(f"torch.compile: {len(comp)} compiled-region events, {len(triton)} triton kernels"
               if len(comp) or len(triton) else "torch.compile: none")
    nccl = kernels[t.is_nccl[kernels]]
    compute = kernels[~t.is_nccl[kernels]]
    n_gaps, longest, idle = _idle_gaps(windows, w)
    short = int(np.sum(t.dur[compute] < 10.0)) if len(compute) else 0
    out.append(f"Compute kernels: {len(compute)}, {short} shorter than 10us; GPU idle "
               f"{pct(idle)} in {n_gaps} gaps")
    if len(nccl):
        same = bool(set(np.unique(t.stream[nccl]).tolist())
                    & set(np.unique(t.stream[compute]).tolist())) if len(compute) else False
        ov = _overlap((t.ts[nccl], t.end[nccl]), (t.ts[compute], t.end[compute]))
        busy = float(_clipped(windows, w, nccl).sum())
        out.append(f"NCCL: {len(nccl)} kernels, mean {_us(t.dur[nccl].mean())}, "
                   f"{'on the SAME stream as compute' if same else 'on their own stream'}, "
                   f"{100 * min(ov / busy, 1.0) if busy > 0 else 0:.0f}% of NCCL time overlapped "
                   f"by compute")
    else:
        out.append("NCCL: none")
    return out


def summary_line(windows: Windows, w: int) -> str:
    """One line per window: GPU busy, kernels, memcpys, NCCL, syncs (for neighbours and the
    pure-LLM baseline)."""
    s = windows.stats
    parts = [
        f"busy {100 * s['gpu_busy_frac'][w]:.0f}%",
        f"{int(s['n_kernels'][w])} kernels (mean {_us(s['mean_kernel_us'][w])}, "
        f"{int(s['n_short_kernels'][w])} <10us, launch delay {_us(s['mean_launch_delay_us'][w])})",
    ]
    if s["n_memcpy"][w]:
        parts.append(f"{int(s['n_memcpy'][w])} memcpy {s['memcpy_mb'][w]:.2f}MB "
                     f"({100 * s['memcpy_time_frac'][w]:.0f}% time)")
    if s["n_nccl"][w]:
        parts.append(f"{int(s['n_nccl'][w])} NCCL ({100 * s['nccl_time_frac'][w]:.0f}% time)")
    if s["n_sync"][w]:
        parts.append(f"{int(s['n_sync'][w])} sync ({100 * s['sync_time_frac'][w]:.0f}% time)")
    parts.append(f"cpu ops {100 * s['cpu_op_time_frac'][w]:.0f}%")
    return ", ".join(parts)


def digest(windows: Windows, w: int, config: DigestConfig = DigestConfig()) -> str:
    """The events of window w as a compact text for the model."""
    c = config
    a, b = windows.edges[w], windows.edges[w + 1]
    t0 = windows.edges[0]
    out = [f"Window {w} of {windows.n}: +{_us(a - t0)} to +{_us(b - t0)} "
           f"(width {_us(b - a)})."]
    n_gaps, longest, idle = _idle_gaps(windows, w)
    out.append(f"GPU busy {100 * (1 - idle / (b - a)):.0f}%, idle {_us(idle)} in {n_gaps} gaps "
               f"over 10us (longest {_us(longest)}).")
    out.append("Key facts:\n" + "\n".join(f"* {x}" for x in key_facts(windows, w)))
    out.append("Summary: " + summary_line(windows, w) + ".")
    kernels = windows.rows_in(w, Kind.KERNEL)
    nccl_mask = windows.trace.is_nccl[kernels]
    compute, nccl = kernels[~nccl_mask], kernels[nccl_mask]
    out += _kernel_lines(windows, w, compute, c)
    out += _host_lines(windows, w, c)
    out += _memcpy_lines(windows, w)
    out += _nccl_lines(windows, w, nccl, compute, c)
    ann = windows.rows_in(w, Kind.USER_ANNOTATION, Kind.GPU_USER_ANNOTATION)
    if len(ann):
        names = windows.trace.names
        top = _by_name(windows, ann, _clipped(windows, w, ann), c.top_annotations)
        out.append("Annotations: " + "; ".join(
            f"{_short(names[code], 60)} {n}x {_us(tot)}" for code, n, tot, _ in top) + ".")
    for d in range(1, c.neighbours + 1):
        for v, side in ((w - d, "before"), (w + d, "after")):
            if 0 <= v < windows.n:
                out.append(f"Window {v} ({side}): {summary_line(windows, v)}.")
    return "\n".join(out)


def _kernel_lines(windows: Windows, w: int, compute: np.ndarray, c: DigestConfig) -> list[str]:
    """The heaviest compute kernels with their launch delays and streams."""
    t = windows.trace
    if not len(compute):
        return []
    out = [f"Top kernels by GPU time in the window (of {len(compute)}):"]
    for code, n, tot, m in _by_name(windows, compute, _clipped(windows, w, compute), c.top_kernels):
        r = compute[m]
        delay = t.launch_delay[r]
        delay = delay[np.isfinite(delay)]
        d = f", launch delay mean {_us(delay.mean())}" if len(delay) else ""
        streams = ",".join(str(int(x)) for x in np.unique(t.stream[r])[:3])
        out.append(f"- {_short(t.names[code], c.max_name)}: {n}x, total {_us(tot)}, mean "
                   f"{_us(t.dur[r].mean())}{d}, stream {streams}")
    return out


def _host_lines(windows: Windows, w: int, c: DigestConfig) -> list[str]:
    """The heaviest CPU ops, runtime calls and synchronising calls."""
    t = windows.trace
    out = []
    cpu = windows.rows_in(w, Kind.CPU_OP, Kind.PYTHON_FUNCTION)
    if len(cpu):
        out.append(f"Top CPU ops by time (of {len(cpu)}):")
        for code, n, tot, _ in _by_name(windows, cpu, _clipped(windows, w, cpu), c.top_cpu_ops):
            out.append(f"- {_short(t.names[code], c.max_name)}: {n}x, total {_us(tot)}")
    rt = windows.rows_in(w, Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER)
    if len(rt):
        top = _by_name(windows, rt, _clipped(windows, w, rt), 4)
        out.append("Runtime calls: " + "; ".join(
            f"{_short(t.names[code], 40)} {n}x {_us(tot)}" for code, n, tot, _ in top) + ".")
        sync = rt[t.is_sync[rt]]
        if len(sync):
            st = _clipped(windows, w, sync)
            out.append(f"Synchronising calls: {len(sync)}, {_us(st.sum())} "
                       f"({', '.join(sorted({t.names[x] for x in t.name[sync]})[:3])}).")
    return out


def _memcpy_lines(windows: Windows, w: int) -> list[str]:
    """Memcpys by direction and source memory, with sizes and the host time they blocked."""
    t = windows.trace
    mc = windows.rows_in(w, Kind.GPU_MEMCPY)
    if not len(mc):
        return []
    keys = t.copy_kind[mc].astype(int) * 16 + t.copy_src[mc].astype(int)
    out = [f"Memcpys ({len(mc)}):"]
    for key in np.unique(keys):
        r = mc[keys == key]
        ck, src = CopyKind(key // 16).name, MemKind(key % 16).name.lower()
        nbytes = float(np.nansum(t.bytes[r]))
        blocked = t.launch[r]
        blocked = blocked[blocked >= 0]
        host = f", host blocked {_us(t.dur[blocked].sum())}" if len(blocked) else ""
        out.append(f"- {ck} from {src}: {len(r)}x, {_mb(nbytes)}, "
                   f"{_us(_clipped(windows, w, r).sum())}{host}")
    return out


def _nccl_lines(windows: Windows, w: int, nccl: np.ndarray, compute: np.ndarray,
                c: DigestConfig) -> list[str]:
    """NCCL kernels: their streams against the compute streams, and the overlap."""
    t = windows.trace
    if not len(nccl):
        return []
    nstreams = sorted(int(x) for x in np.unique(t.stream[nccl]))
    cstreams = sorted(int(x) for x in np.unique(t.stream[compute])) if len(compute) else []
    shared = sorted(set(nstreams) & set(cstreams))
    ov = _overlap((t.ts[nccl], t.end[nccl]), (t.ts[compute], t.end[compute]))
    ntime = float(_clipped(windows, w, nccl).sum())
    out = [f"NCCL kernels ({len(nccl)}, {_us(ntime)}, mean {_us(t.dur[nccl].mean())}) "
           f"on streams {nstreams}; compute kernels on streams {cstreams}"
           + (f"; SAME stream {shared}" if shared else "; separate streams")
           + f"; NCCL time overlapped by compute {_us(ov)}."]
    for code, n, tot, m in _by_name(windows, nccl, _clipped(windows, w, nccl), 3):
        elems = t.comm_nelems[nccl[m]]
        elems = elems[elems >= 0]
        e = f", {int(elems.mean())} elements" if len(elems) else ""
        out.append(f"- {_short(t.names[code], c.max_name)}: {n}x, total {_us(tot)}{e}")
    return out


def messages(windows: Windows, w: int, config: DigestConfig = DigestConfig(),
             allow_none: bool = True) -> list[dict]:
    """Chat messages asking the model to classify window w."""
    ask = ("The anomaly detector flagged this window. Which anti-pattern does it show, or is "
           "it a false alarm?" if allow_none else
           "This window contains one of the anti-patterns. Which one?")
    user = ask + "\n\n" + digest(windows, w, config)
    return [{"role": "system", "content": system_prompt(allow_none)},
            {"role": "user", "content": user}]


# -- the answer ------------------------------------------------------------------------------
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.MULTILINE)


def _aliases() -> dict[str, str]:
    """'some id' and 'some-id' -> 'some_id' for every pattern id: ids as a
    small model writes them."""
    ids = pattern_ids()
    return {p.replace("_", " "): p for p in ids} | {p.replace("_", "-"): p for p in ids}


def extract_json(text: str) -> dict:
    """The first JSON object in a reply (code fences and prose around it are tolerated)."""
    text = _FENCE.sub("", (text or "").strip())
    start = text.find("{")
    if start < 0:
        raise AnswerError("no JSON object in the reply")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise AnswerError(f"reply is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(obj, dict):
        raise AnswerError("reply is not a JSON object")
    return obj


def _bool(x) -> bool:
    if isinstance(x, bool):
        return x
    if isinstance(x, str) and x.strip().lower() in ("true", "false"):
        return x.strip().lower() == "true"
    raise AnswerError(f"false_alarm must be true or false, not {x!r}")


def parse_answer(text: str, allow_none: bool = True) -> Answer:
    """Validate a reply against `answer_schema`; raise `AnswerError` saying what is wrong."""
    obj = extract_json(text)
    missing = [k for k in ANSWER_SCHEMA["required"] if k not in obj]
    if missing:
        raise AnswerError(f"missing field(s): {', '.join(missing)}")
    raw = str(obj["pattern"]).strip()
    pattern = raw.lower()
    pattern = _aliases().get(pattern, pattern)
    if pattern not in pattern_ids() and (pattern != NONE or not allow_none):
        raise AnswerError(f"unknown pattern {raw!r}")
    try:
        conf = float(obj["confidence"])
    except (TypeError, ValueError):
        raise AnswerError(f"confidence must be a number, not {obj['confidence']!r}") from None
    if 1.0 < conf <= 100.0:  # a percentage
        conf /= 100.0
    if not 0.0 <= conf <= 1.0:
        raise AnswerError(f"confidence {conf} is outside [0, 1]")
    false_alarm = _bool(obj["false_alarm"]) or pattern == NONE
    return Answer(pattern=pattern, confidence=conf, evidence=str(obj["evidence"]).strip(),
                  fix=str(obj["fix"]).strip(), false_alarm=false_alarm)


# -- the pure-LLM baseline: score every window of a sub-trace -----------------------------------
def score_system() -> str:
    """The pure-LLM baseline's system prompt: the task and every pattern's signature."""
    return (
        "You are an expert in PyTorch performance. You read a PyTorch profiler trace cut into "
        "consecutive time windows, one summary line per window, and score each window for "
        "performance anti-patterns (0 = normal, 1 = certainly an anti-pattern). The anti-patterns:\n"
        + "\n".join(f"- {p}: {s}" for p, s in signatures().items())
        + '\nAnswer with one JSON object only: {"scores": [one number per window, in order]}.'
    )


def score_schema(n: int) -> dict:
    """JSON schema for the pure-LLM answer: exactly n scores."""
    return {
        "type": "object",
        "properties": {"scores": {"type": "array", "items": {"type": "number"},
                                  "minItems": n, "maxItems": n}},
        "required": ["scores"],
        "additionalProperties": False,
    }


def _top_host_op(windows: Windows, w: int) -> str:
    """', top op NAME TIME' for the heaviest CPU op / annotation in window w (names such as
    the DataLoader's or torch.compile's give patterns away)."""
    rows = windows.rows_in(w, Kind.CPU_OP, Kind.PYTHON_FUNCTION, Kind.USER_ANNOTATION)
    time = _clipped(windows, w, rows)
    # Spans enclosing the whole window (ProfilerStep, "## forward ##") say nothing about it.
    inner = time < 0.9 * windows.width_us
    top = _by_name(windows, rows[inner], time[inner], 1)
    if not top:
        return ""
    code, n, tot, _ = top[0]
    return f", top op {_short(windows.trace.names[code], 60)} {n}x {_us(tot)}"


def score_messages(windows: Windows, idx: np.ndarray) -> list[dict]:
    """Chat messages asking for one score per window in `idx` (a sub-trace)."""
    t0 = windows.edges[0]
    lines = [f"{j}. window {w} (+{_us(windows.edges[w] - t0)}): {summary_line(windows, w)}"
             + _top_host_op(windows, int(w)) for j, w in enumerate(idx)]
    user = (f"{len(idx)} windows of {_us(windows.width_us)} each:\n" + "\n".join(lines)
            + f"\n\nGive exactly {len(idx)} scores.")
    return [{"role": "system", "content": score_system()}, {"role": "user", "content": user}]


def parse_scores(text: str, n: int) -> np.ndarray:
    """Validate a pure-LLM reply: exactly n numbers in [0, 1] (percentages are rescaled)."""
    obj = extract_json(text)
    scores = obj.get("scores")
    if not isinstance(scores, list) or len(scores) != n:
        raise AnswerError(f"expected a list of {n} scores")
    try:
        arr = np.array([float(x) for x in scores], dtype=np.float64)
    except (TypeError, ValueError):
        raise AnswerError("scores must be numbers") from None
    if np.any(arr > 1.0) and np.all(arr <= 100.0):
        arr = arr / 100.0
    if not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(arr > 1):
        raise AnswerError("scores must lie in [0, 1]")
    return arr


__all__ = ["ANSWER_SCHEMA", "Answer", "AnswerError", "DigestConfig", "NONE",
           "answer_schema", "digest", "extract_json", "messages", "parse_answer", "parse_scores",
           "score_messages", "score_schema", "score_system", "signatures", "summary_line",
           "system_prompt"]
