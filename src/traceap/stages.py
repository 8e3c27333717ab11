"""Choosing the stages: from options to the detector (stage 4) and the classifier (stage 5).

The one builder every command uses (`analyze`, `profile`, `diff`, `eval`) and the library
behind them (`traceap.analysis.analyze`, `traceap.job.analyze_job`):

    opts = StageOptions(detector="model", model=Path("ckpt.pt"), redetect=1)
    opts.check()                        # names, numbers, combinations: one line each
    detector, classifier = build_stages(opts)

`build_stages` builds what the options name before any trace is read (so a checkpoint or an
LLM server option fails first), and leaves "the best detector available" (None) and the
offline classifier to `resolve_detector` / `resolve_classifier`, which run where the trace is
analysed (in each worker for a job) and say in the analysis' notes what they chose.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .classify import Classifier, classifier_names, make_classifier
from .detectors import Detector, detector_names, make_detector
from .detectors.base import missing_members
from .errors import TraceapError

#: Detectors built on the trained model: `--model` is their checkpoint.
MODEL_BASED = ("model", "hybrid")


@dataclass(frozen=True)
class StageOptions:
    """The command line's stage options (`traceap analyze --help`); the defaults choose the
    best detector available and the offline classifier."""

    detector: str | None = None
    model: Path | None = None
    classifier: str = "offline"
    llm_url: str | None = None
    llm_model: str | None = None
    redetect: int = 0
    threshold: float | None = None

    def check(self) -> None:
        """The checks that need nothing built: known names, numbers in range (one line each)."""
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise TraceapError("--threshold must be between 0 and 1")
        if self.detector is not None and self.detector not in detector_names():
            raise TraceapError(f"unknown detector {self.detector!r}; choose one of "
                               f"{', '.join(detector_names())}")
        if self.classifier not in classifier_names():
            raise TraceapError(f"unknown classifier {self.classifier!r}; choose one of "
                               f"{', '.join(classifier_names())}")


def default_model_path() -> Path:
    """Where the bundled trained detector lives (traceap/data/model.pt)."""
    return Path(str(resources.files("traceap") / "data" / "model.pt"))


def detector_options(name: str, model: Path | None = None, llm_url: str | None = None,
                     llm_model: str | None = None) -> dict:
    """The constructor options the command line gives detector `name`: --model for the
    detectors built on the trained model, the LLM settings for the LLM."""
    if name in MODEL_BASED and model is not None:
        return {"path": str(model)}
    if name == "llm":
        return {"url": llm_url, "model": llm_model}
    return {}


def build_stages(options: StageOptions) -> tuple[Detector | None, Classifier | str]:
    """(detector, classifier) as the options ask, built here so that a broken checkpoint or LLM
    option fails before the trace is read; left to `resolve_detector` / `resolve_classifier`
    where the trace is analysed: no detector named (None: the best one available, said in the
    notes) and the offline classifier ("offline": it blends in the detector's pattern head)."""
    o = options
    o.check()
    if o.model is not None:
        if o.detector not in (None, *MODEL_BASED):
            raise TraceapError("--model goes with --detector model or hybrid")
        if not o.model.exists():
            raise TraceapError(f"{o.model}: no such model checkpoint")
    if (o.llm_url or o.llm_model) and "llm" not in (o.classifier, o.detector):
        raise TraceapError("--llm-url / --llm-model go with --classifier llm or --detector llm")
    if o.redetect < 0:
        raise TraceapError("--redetect must be 0 or more")
    det: Detector | None = None
    name = o.detector or ("model" if o.model is not None else None)
    if name is not None:
        # a broken checkpoint or LLM setting fails here, before the load
        det = make_detector(name, **detector_options(name, o.model, o.llm_url, o.llm_model))
    # "offline" is resolved beside the detector (it blends in the detector's pattern head)
    clf: Classifier | str = o.classifier
    if o.classifier != "offline":
        clf = make_classifier(o.classifier, **({"url": o.llm_url, "model": o.llm_model}
                                               if o.classifier == "llm" else {}))
    if o.redetect:
        from .classify.redetect import RedetectConfig, RedetectingClassifier
        det = resolve_detector(det, [])
        clf = RedetectingClassifier(resolve_classifier(clf, det), det, o.threshold,
                                    RedetectConfig(max_rounds=o.redetect))
    return det, clf


def resolve_detector(detector: Detector | str | None, notes: list[str]) -> Detector:
    """A detector instance from an instance, a name, or None (the best one available); how
    None was resolved goes to `notes`."""
    if detector is None:
        path = default_model_path()
        if path.exists():
            try:
                det = make_detector("hybrid")
                notes.append(f"detector: the trained model ({path.name}) and the expert rules, "
                             f"stacked (weights fitted on real validation traces)")
                return det
            except Exception as exc:  # noqa: BLE001 - a broken checkpoint must not stop analysis
                notes.append(f"detector: expert rules (the bundled model did not load: {exc})")
        else:
            notes.append("detector: expert rules (no trained model bundled)")
        return make_detector("expert")
    if isinstance(detector, str):
        return make_detector(detector)
    if not isinstance(detector, Detector):
        raise TraceapError(f"{detector!r} is not a detector: it lacks "
                           f"{', '.join(missing_members(detector))} (subclass "
                           f"traceap.detectors.BaseDetector)")
    return detector


def resolve_classifier(classifier: Classifier | str | None, detector: Detector | None = None,
                       notes: list[str] | None = None) -> Classifier:
    """A classifier instance from an instance, a name, or None (offline expert rules).

    The offline classifier blends in the detector's learned pattern head when it has one
    (`Detector.pattern_head`, e.g. the trained model)."""
    if classifier is None or classifier == "offline":
        head = detector.pattern_head if detector is not None else None
        if head is not None and notes is not None:
            notes.append("classifier: expert rules, averaged with the model's pattern scores")
        return make_classifier("offline", pattern_head=head)
    if isinstance(classifier, str):
        return make_classifier(classifier)
    if not isinstance(classifier, Classifier):
        raise TraceapError(f"{classifier!r} is not a classifier (subclass "
                           f"traceap.classify.BaseClassifier)")
    return classifier


__all__ = ["MODEL_BASED", "StageOptions", "build_stages", "default_model_path",
           "detector_options", "resolve_classifier", "resolve_detector"]
