"""Where traceap writes: folders a command owns, and output files checked before the work.

A command that writes a folder (synth, inject, collect, eval --out, profile) keeps a stamp
file there (docs/FORMATS.md, "Output stamps"): which command wrote it, with which
configuration, and every file it wrote.  A later run reads the stamp to know what it may
replace; a file it did not write is never replaced or deleted, whatever the options.
`claim` checks a folder before anything is written (one-line `OutputError`, nothing touched);
`Claim.begin` and `Claim.finish` keep the stamp true while and after the command writes.

`check_writable` and `write_bytes` do the same for a single output file (--json, --html,
--annotate): a target that cannot be written is one line before the trace is read, and a
write that fails anyway (a full disk, /dev/full) is one line too, not a traceback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import orjson

from .errors import OutputError


#: How a command treats a folder an earlier run of its own wrote.
#: "same_config": a rerun of the same configuration rewrites it in place; another one needs
#: --overwrite (synth, inject).  "any": every rerun replaces its own files (eval, collect).
#: "overwrite": a folder is one run; another run needs --overwrite (profile).
RERUN_POLICIES = ("same_config", "any", "overwrite")


@dataclass(frozen=True)
class Owner:
    """A command that writes a folder, and how it treats what is already there."""

    command: str                  # "inject": said in messages ("an earlier inject run")
    #: the stamp file's name in the folder; None for a command whose own files say that they
    #: are its own (collect: its manifest lines), found by `claim`'s `legacy`
    stamp: str | None
    schema: str | None            # the stamp's "schema"
    rerun: str = "same_config"    # one of RERUN_POLICIES
    #: False: a folder holding files another command (or the user) wrote needs --overwrite,
    #: and the new files go beside them; True: such a folder is fine (eval --out into a
    #: results folder).  Either way a file in the way of a new one stops the run.
    foreign_ok: bool = False
    #: Files the command rewrites on every run (manifest.jsonl): a foreign one is kept under
    #: another name (NAME.before-COMMAND.EXT) instead of stopping the run.
    aside: tuple[str, ...] = ()

    def __post_init__(self):
        if self.rerun not in RERUN_POLICIES:
            raise ValueError(f"rerun must be one of {RERUN_POLICIES}")


@dataclass
class Claim:
    """A folder checked for one run of `owner`: what an earlier run of it left there."""

    out: Path
    owner: Owner
    config: dict | None
    #: files (relative, '/'-separated) an earlier run of the owner wrote, from its stamp
    previous: set[str] = field(default_factory=set)
    #: what happened to files already there (one line each, for the user)
    notes: list[str] = field(default_factory=list)

    def begin(self, planned: Iterable[str] = ()) -> None:
        """Write the stamp before the first file: an interrupted run is still recognised as
        the owner's, with the files of the earlier run it may not have replaced yet."""
        self.out.mkdir(parents=True, exist_ok=True)
        self._stamp(set(planned) | self.previous)

    def add(self, files: Iterable[str]) -> None:
        """Record files written since `begin` (for commands that do not know them ahead)."""
        self.previous |= set(files)
        self._stamp(self.previous)

    def finish(self, written: Iterable[str]) -> list[str]:
        """Stamp the folder with the files this run wrote; delete the earlier run's files it
        did not write again (only those: they are listed in the earlier stamp); return the
        notes, with one line saying what was replaced."""
        written = set(written)
        stale = sorted(self.previous - written)
        for rel in stale:
            (self.out / rel).unlink(missing_ok=True)
        rewritten = self.previous & written
        self._stamp(written)
        if self.previous:
            self.notes.append(f"replaced {_count(self.previous)} of an earlier {self.owner.command} "
                              f"run in {self.out} ({len(rewritten)} rewritten, {len(stale)} "
                              f"removed)")
        return self.notes

    def _stamp(self, files: set[str]) -> None:
        data = {"schema": self.owner.schema, "config": self.config, "files": sorted(files)}
        tmp = self.out / f"{self.owner.stamp}.{os.getpid()}.tmp"   # ranks may write at once
        tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
        os.replace(tmp, self.out / self.owner.stamp)


def read_stamp(out: Path, owner: Owner) -> dict | None:
    """The owner's stamp in `out`, or None when there is none (or it is not the owner's)."""
    if owner.stamp is None:
        return None
    try:
        stamp = orjson.loads((Path(out) / owner.stamp).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(stamp, dict) or stamp.get("schema") != owner.schema:
        return None
    return stamp


def claim(out: str | os.PathLike, owner: Owner, config: dict | None = None,
          planned: Iterable[str] = (), overwrite: bool = False,
          legacy: Callable[[Path], set[str] | None] | None = None,
          describe: Callable[[dict], str] | None = None) -> Claim:
    """Check that `out` may receive a run of `owner` with `config`, before anything is written.

    `planned` are the files the run will write (relative paths); `legacy(out)` recognises an
    output of the owner written before stamps existed (its files, or None); `describe(config)`
    names an earlier configuration in the refusal.  Raises OutputError, with nothing written,
    for a folder the run may not write into (see `Owner`).  With `overwrite`, an earlier run's
    files may be replaced; files the owner did not write never are."""
    out = Path(out)
    cmd = owner.command
    check_folder(out)
    result = Claim(out, owner, config)
    # A folder without files is new: empty folders left by a stopped run, or the stamp alone
    # (or its temporary file, while another rank of a torchrun job writes it).
    if not out.exists() or not any(p.is_file() and not (owner.stamp and p.name.startswith(
            owner.stamp)) for p in out.rglob("*")):
        return result
    stamp = read_stamp(out, owner)
    ours = None
    if stamp is not None:
        result.previous = {str(f) for f in stamp.get("files") or ()}
        old = stamp.get("config")
        again = owner.rerun == "any" or (owner.rerun == "same_config" and old == config)
        if not again and not overwrite:
            what = (f" of another configuration ({describe(old)})" if describe and old and
                    owner.rerun == "same_config" else "")
            raise OutputError(f"{out}: holds {_count(result.previous)} of an earlier traceap "
                              f"{cmd} run{what}; nothing written: give another --out, or "
                              f"--overwrite to replace them (files traceap {cmd} did not write "
                              f"are kept)")
    else:
        ours = legacy(out) if legacy is not None else None
        if ours is not None:
            if owner.rerun != "any" and not overwrite:
                raise OutputError(f"{out}: holds the output of an earlier traceap {cmd} run of "
                                  f"unknown configuration (no {owner.stamp}: an older traceap); "
                                  f"nothing written: give another --out, or --overwrite to "
                                  f"replace it")
            result.previous = ours
        elif not owner.foreign_ok and not overwrite:
            n = sum(1 for p in out.rglob("*") if p.is_file())
            raise OutputError(f"{out}: not empty ({n} files) and not written by traceap {cmd}; "
                              f"nothing written: give a new or empty --out (--overwrite writes "
                              f"beside the files there, keeping every one)")
    mine = result.previous | ({owner.stamp} if owner.stamp else set())
    clash = [f for f in sorted(set(planned)) if f not in mine and (out / f).exists()]
    moved = [f for f in clash if f in owner.aside]
    clash = [f for f in clash if f not in owner.aside]
    if clash:
        raise OutputError(f"{out}: {clash[0]}" + (f" (and {len(clash) - 1} more)" if
                                                 len(clash) > 1 else "")
                          + f" exists and was not written by traceap {cmd}; nothing written: "
                            f"give another --out")
    for rel in moved:
        keep = _aside_name(out / rel, cmd)
        os.replace(out / rel, keep)
        result.notes.append(f"the {rel} that was in {out} is kept as {keep.name}")
    if stamp is None and ours is None and not owner.foreign_ok:
        foreign = sum(1 for p in out.rglob("*") if p.is_file()
                      and p.relative_to(out).as_posix() not in mine)
        if foreign:
            result.notes.append(f"the {foreign} file(s) already in {out} are kept")
    return result


def _aside_name(path: Path, cmd: str) -> Path:
    """manifest.jsonl -> manifest.before-inject.jsonl (numbered when that exists too)."""
    stem, dot, ext = path.name.partition(".")
    k, keep = 0, path.with_name(f"{stem}.before-{cmd}{dot}{ext}")
    while keep.exists():
        k += 1
        keep = path.with_name(f"{stem}.before-{cmd}.{k}{dot}{ext}")
    return keep


def _count(files: Iterable[str]) -> str:
    """'21 traces and 2 other files' (traces: profiler trace files)."""
    files = list(files)
    traces = sum(1 for f in files if ".pt.trace.json" in f or f.endswith((".json.gz",)))
    other = len(files) - traces
    parts = []
    if traces:
        parts.append(f"{traces} trace{'s' * (traces != 1)}")
    if other or not traces:
        parts.append(f"{other} {'other ' if traces else ''}file{'s' * (other != 1)}")
    return " and ".join(parts)


# --------------------------------------------------------------------------------------------
# single output files


def check_writable(path: str | os.PathLike, what: str) -> None:
    """Raise OutputError (one line) when a file cannot be written at `path`: checked before
    the work, so a long analysis does not end in a failed write.  A missing parent folder is
    fine (the writer creates it) as long as the nearest existing ancestor is a writable
    folder."""
    path = Path(path)
    if str(path) == "-":
        return
    if path.is_dir():
        raise OutputError(f"{what} {path}: is a folder; give a file name")
    if path.exists():
        if not os.access(path, os.W_OK) or _pseudo(path):
            raise OutputError(f"{what} {path}: cannot be written (not writable)")
        return
    _creatable(path, what)


def check_replaceable(path: str | os.PathLike, what: str, kind: str, is_kind, overwrite: bool,
                      *, command: str, held: str, replaced: str,
                      not_done: str = "nothing written", force: bool = False) -> str | None:
    """Check before any work that the single file `path` may be written; returns a note when
    it replaces one.  A file that is not a `kind` (`is_kind(path)` False) is never replaced;
    one that is (`held` says what it holds), only with `overwrite` (or `force`: the command
    was asked to replace that very file)."""
    path = Path(path)
    check_writable(path, what)
    if not path.exists():
        return None
    if not is_kind(path):
        raise OutputError(f"{what} {path}: exists and is not a {kind}; {not_done}: give another "
                          f"{what} ({command} never replaces it)")
    if not (overwrite or force):
        raise OutputError(f"{what} {path}: holds {held}; {not_done}: give another {what}, or "
                          f"--overwrite to replace it")
    return f"replaced {replaced} at {path}"


def check_folder(path: str | os.PathLike, what: str = "--out") -> None:
    """Raise OutputError (one line) when files cannot be written in the folder `path` (it
    exists and is a writable folder, or can be created)."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise OutputError(f"{what} {path}: exists and is not a folder")
        if _pseudo(path) or not os.access(path, os.W_OK | os.X_OK):
            raise OutputError(f"{what} {path}: cannot be written (no permission to create "
                              f"files in it)")
        return
    _creatable(path, what)


def _creatable(path: Path, what: str) -> None:
    """`path` does not exist: its nearest existing ancestor must be a writable folder."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"{what} {path}: cannot be written ({parent} is not a folder)")
    if _pseudo(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {path}: cannot be written (no permission to create files "
                          f"in {parent})")


def _pseudo(path: Path) -> bool:
    """True under /proc or /sys: kernel file systems where root may pass `os.access` and
    still not create a file."""
    parts = path.resolve().parts
    return len(parts) > 1 and parts[1] in ("proc", "sys")


def write_bytes(path: str | os.PathLike, data: bytes, what: str) -> Path:
    """Write `data` to `path` (its folder created); a failed write is one OutputError line."""
    path = Path(path)
    with failing_write(path, what):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return path


class failing_write:
    """Context manager: an OSError while writing `path` becomes one OutputError line."""

    def __init__(self, path: str | os.PathLike, what: str):
        self.path, self.what = Path(path), what

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, OSError) and \
                not isinstance(exc, OutputError):
            reason = exc.strerror or str(exc)
            raise OutputError(f"{self.what} {self.path}: cannot be written ({reason})") from None
        return False


__all__ = ["Claim", "OutputError", "Owner", "RERUN_POLICIES", "check_folder", "check_replaceable",
           "check_writable", "claim", "failing_write", "read_stamp", "write_bytes"]
