"""One config object for the whole detector (paper section 6.2 numbers in the "paper" preset)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from ..patterns import PAPER, is_pattern, pattern_ids

#: The pattern head of a checkpoint whose config names none (`head_patterns` missing: written
#: before the head's list was part of the config, the bundled `data/model.pt` among them): the
#: paper's eight, the patterns those checkpoints were trained on.
LEGACY_HEAD_PATTERNS: tuple[str, ...] = PAPER

#: Paper Table 5's switches, plus `names_masked` (every event nameless: does the detector lean
#: on names only the simulator ties to a pattern?).
ABLATIONS = ("no_event_adapter", "no_transformer", "no_relation", "names_masked")


#: Fields that only steer training (losses, optimiser, schedule, seed): checkpoints that differ
#: in them alone score windows with the same network, so they can join one ensemble.
TRAINING_FIELDS = frozenset({
    "trace_pool", "topk_fraction", "s_pos", "s_neg", "w_trace", "w_svm", "w_cluster", "w_smooth",
    "w_pattern", "w_window", "w_window_pattern", "svm_c", "lr", "weight_decay", "batch_size",
    "epochs", "windows", "platform_dropout", "pair_same_base", "seed", "name_dropout",
    "pretrain_steps", "pretrain_mask"})


@dataclass(frozen=True)
class ModelConfig:
    """Sizes, feature settings, loss weights and training settings of the learned detector.

    The defaults are the paper's (d=128, D=2d=256, 6 layers, 8 heads, AdamW lr 1e-4, batch 8);
    `preset("small")` is the CPU-sized default that ships inside the package.
    """

    name: str = "paper"
    # -- sizes ------------------------------------------------------------------------------
    d: int = 128                  # per-attribute event embedding (paper d)
    layers: int = 6               # transformer encoder layers of the window encoder
    heads: int = 8                # attention heads (window encoder and relation module)
    mlp_ratio: float = 2.0        # FFN width / D in the transformer blocks
    text_dim: int = 384           # width of the frozen text embeddings (MiniLM-L6)
    platform_tokens: int = 4      # learned tokens per hardware platform (cross-attention keys)
    dilations: tuple[int, ...] = (1, 2, 4)   # dilated 1-D convs of the window-to-window module
    relation_layers: int = 1      # self-attention layers over windows
    dropout: float = 0.1
    # -- features (paper eq. 3 and 6) -------------------------------------------------------
    max_events: int = 64          # anchor events kept per window (see event_sampling)
    event_sampling: str = "diverse"  # how to cap long windows: "diverse" or "strided"
    time_vocab: int = 64          # N of eq. 3: quantisation levels of launch delay and duration
    t_min_us: float = 0.5         # T_min of eq. 3 (fixed, so unseen traces quantise alike)
    t_max_us: float = 1e6         # T_max of eq. 3
    max_streams: int = 16         # stream index is the rank of the stream in the trace, capped
    rope_time_scale: float = 64.0  # relative start in [0, 1] is scaled by this for RoPE
    window_summary: bool = True   # beyond the paper: per-window measures added to the CLS token
    summary_relative: bool = False  # also feed each measure minus its median over the trace
    summary_absolute: bool = True  # feed the measures themselves (False: relative ones only)
    summary_extra: bool = False   # add the longest GPU-idle stretch of the window
    summary_idle: bool = False    # add the window's GPU-idle time by mechanism (idle.py's
    #                               account: measured shares of the window, not names)
    summary_split: bool = False   # with summary_idle: the sixteen patterns' newer mechanisms
    #                               on their own and the busy-time losses (features.SUMMARY_SPLIT)
    split_inputs: tuple[str, ...] = ()  # with summary_split: the inputs it reads, in order;
    #                               () = features.SUMMARY_SPLIT of now, fixed when a model is
    #                               built (`with_head`), so a mechanism or busy-time pattern
    #                               added later leaves a checkpoint's inputs as they were
    time_absolute: bool = True    # launch delay and duration quantised in us (paper eq. 3)
    time_relative: bool = False   # add delay, idle gap before the event and duration relative
    #                               to the trace's own typical values (other GPUs, batch sizes)
    name_dropout: float = 0.0     # train-time chance to hide an event's names (unseen models)
    host_events: int = 0          # beyond the paper: also feed each window's dominant host events
    #                               (CPU ops, annotations, runtime calls; features.host_pick)
    platform_embedding: bool = True  # False: one shared "unknown" platform for every trace
    # -- pattern head (beyond the paper) ----------------------------------------------------
    head_patterns: tuple[str, ...] = ()  # pattern ids the head names, one output each, in
    #                               order; () = every registered pattern (`pattern_ids()`),
    #                               fixed when a model is built (`with_head`); checkpoints
    #                               store the list (LEGACY_HEAD_PATTERNS where they do not)
    # -- ablations (paper Table 5) ----------------------------------------------------------
    no_event_adapter: bool = False
    no_transformer: bool = False
    no_relation: bool = False
    names_masked: bool = False    # every event nameless, in training and scoring
    # -- losses (paper 5.5) -----------------------------------------------------------------
    trace_pool: str = "mean"      # "mean" (paper eq. 10) or "topk" (mean of the top fraction)
    topk_fraction: float = 0.2    # for trace_pool="topk" and the pattern head's MIL pooling
    s_pos: float = 0.1            # S+: fraction of a normal trace's windows in the SVM loss
    s_neg: float = 0.1            # S-: fraction of an abnormal trace's windows in the SVM loss
    w_trace: float = 1.0
    w_svm: float = 0.1
    w_cluster: float = 0.1
    w_smooth: float = 0.1
    w_pattern: float = 0.5        # beyond the paper: pattern head from trace-level patterns
    w_window: float = 0.0         # beyond the paper: BCE of each window's score against its
    #                               label where a train trace's anomalies are known (planted or
    #                               simulated); 0 keeps the paper's trace-level weak supervision
    w_window_pattern: float = 0.0  # the same for the pattern head: per-window BCE against the
    #                               patterns of the anomalies each window overlaps
    svm_c: float = 1e-3           # L2 weight of the SVM hyperplane
    # -- training ---------------------------------------------------------------------------
    lr: float = 1e-4
    weight_decay: float = 0.01
    batch_size: int = 8           # traces per step: batch_size / 2 (good, bad) pairs
    epochs: int = 20
    windows: tuple[int, ...] = (100,)   # N_w used in training (one drawn per step)
    platform_dropout: float = 0.2  # train-time chance to hide the platform (unseen GPUs)
    pair_same_base: float = 0.0   # chance that a planted trace is paired with its own unmodified
    #                               base (same trace without the anomaly) as the good partner
    seed: int = 0
    pretrain_steps: int = 0       # beyond the paper: self-supervised steps on unlabelled traces
    #                               before training (`traceap.model.pretrain`: masked windows)
    pretrain_mask: float = 0.15   # share of a trace's windows hidden in each pretraining step

    @property
    def window_supervised(self) -> bool:
        """Whether training reads the train traces' anomaly intervals (`w_window` terms)."""
        return self.w_window > 0 or self.w_window_pattern > 0

    @property
    def D(self) -> int:  # noqa: N802 - the paper's name
        """Window embedding width, D = 2d."""
        return 2 * self.d

    def with_head(self) -> "ModelConfig":
        """This config with its pattern head's list explicit: () becomes every pattern
        registered now (what a new model is built and trained on, and what its checkpoint
        stores); with `summary_split`, its split inputs likewise (`features.SUMMARY_SPLIT`)."""
        cfg = self if self.head_patterns else replace(self, head_patterns=pattern_ids())
        if cfg.summary_split and not cfg.split_inputs:
            from .features import SUMMARY_SPLIT
            cfg = replace(cfg, split_inputs=SUMMARY_SPLIT)
        return cfg

    def to_dict(self) -> dict:
        """Plain dict (tuples as lists) for checkpoints."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        """Inverse of `to_dict`; unknown keys are ignored, missing ones take defaults, except
        a missing `head_patterns`: LEGACY_HEAD_PATTERNS, the head older checkpoints have."""
        known = {f.name: f for f in fields(cls)}
        kw = {"head_patterns": LEGACY_HEAD_PATTERNS}
        for k, v in data.items():
            if k in known:
                kw[k] = tuple(v) if isinstance(v, list) else v
        return cls(**kw)

    def with_ablations(self, names) -> "ModelConfig":
        """A copy with the given Table-5 ablation switches turned on."""
        names = [n.replace("-", "_") for n in names if n]
        bad = [n for n in names if n not in ABLATIONS]
        if bad:
            raise ValueError(f"unknown ablation {bad[0]!r} (choose from {', '.join(ABLATIONS)})")
        return replace(self, **{n: True for n in names})

    def with_overrides(self, pairs) -> "ModelConfig":
        """A copy with "key=value" settings applied (values parsed by the field's type; a
        tuple is comma-separated: integers, or pattern ids for `head_patterns`)."""
        types = {f.name: type(getattr(self, f.name)) for f in fields(self)}
        kw = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in types:
                raise ValueError(f"bad setting {pair!r} (expected key=value with a config field)")
            typ = types[key]
            if key == "head_patterns":
                kw[key] = _pattern_list(value)   # its own message: which id is unknown
                continue
            try:
                if typ is bool:
                    kw[key] = value.strip().lower() in ("1", "true", "yes", "on")
                elif typ is tuple:
                    kw[key] = tuple(int(v) for v in value.split(",") if v.strip())
                else:
                    kw[key] = typ(value)
            except ValueError:
                raise ValueError(f"bad value for {key}: {value!r}") from None
        return replace(self, **kw)

    def __post_init__(self):
        if self.event_sampling not in ("diverse", "strided"):
            raise ValueError("event_sampling must be 'diverse' or 'strided'")
        if self.trace_pool not in ("mean", "topk"):
            raise ValueError("trace_pool must be 'mean' or 'topk'")
        if self.D % self.heads or (self.D // self.heads) % 4:
            raise ValueError("D / heads must be a multiple of 4 (2-D RoPE splits each head)")
        if not 0 <= self.host_events <= 16:
            raise ValueError("host_events must be between 0 and 16 (features.HOST_CAP)")
        if not (self.time_absolute or self.time_relative):
            raise ValueError("time_absolute and time_relative cannot both be off")
        if self.window_summary and not (self.summary_absolute or self.summary_relative):
            raise ValueError("summary_absolute and summary_relative cannot both be off")
        if self.batch_size < 2 or self.batch_size % 2:
            raise ValueError("batch_size must be even (good/bad pairs)")
        if len(set(self.head_patterns)) != len(self.head_patterns):
            raise ValueError("head_patterns names a pattern twice")


PRESETS: dict[str, ModelConfig] = {
    "paper": ModelConfig(summary_relative=True),
    # CPU-sized: trains on the 460 traces of the generated set in minutes on 2 cores.
    "small": ModelConfig(name="small", d=32, layers=2, heads=4, max_events=32, dropout=0.0,
                         lr=1e-3, epochs=8, windows=(50, 100, 200), summary_relative=True,
                         name_dropout=0.1, trace_pool="topk"),
}


def _pattern_list(value: str) -> tuple[str, ...]:
    """`head_patterns` from a setting: comma-separated registered pattern ids (none: every
    registered pattern).  Raises ValueError naming an unknown id."""
    ids = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [p for p in ids if not is_pattern(p)]
    if bad:
        raise ValueError(f"unknown pattern {bad[0]!r} in head_patterns "
                         f"(choose from {', '.join(pattern_ids())})")
    return ids


def preset(name: str) -> ModelConfig:
    """The named config ("paper" or "small")."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model config {name!r} (choose from {', '.join(PRESETS)})") from None


__all__ = ["ABLATIONS", "LEGACY_HEAD_PATTERNS", "ModelConfig", "PRESETS", "TRAINING_FIELDS",
           "preset"]
