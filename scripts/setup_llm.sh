#!/usr/bin/env bash
# Optional LLM stage: build llama-cpp-python[server] into .venv and fetch a small model.
#   bash scripts/setup_llm.sh                 # the smallest model (smollm2, for tests)
#   bash scripts/setup_llm.sh qwen1.5b        # any of: smollm2 qwen0.5b qwen1.5b
# Idempotent and cached under $HOME/.cache/traceap (the built wheel and the joined models), so
# a re-run takes seconds.  The first build takes about 6.5 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_VERSION=0.3.36
CACHE=${TRACEAP_CACHE:-$HOME/.cache/traceap}
WHEELS="$CACHE/wheels"
PY=.venv/bin/python
[ -x "$PY" ] || bash scripts/setup.sh

# llama.cpp's native build (-march=native) dies with SIGILL on these machines (the CPU reports
# AMX it cannot run), so pin the instruction sets instead.
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

if ! "$PY" -c "import llama_cpp, llama_cpp.server, uvicorn; assert llama_cpp.__version__ == '$LLAMA_VERSION'" 2>/dev/null; then
  mkdir -p "$WHEELS"
  wheel=$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    echo "setup_llm: building llama-cpp-python $LLAMA_VERSION (about 6.5 min on 2 cores) ..."
    nice "$PY" -m pip wheel -q --no-deps -w "$WHEELS" "llama-cpp-python==$LLAMA_VERSION" 2>&1 \
      | grep -v "^WARNING: Location" || true
    wheel=$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl 2>/dev/null | head -1 || true)
    [ -n "$wheel" ] || { echo "setup_llm: the llama-cpp-python build failed" >&2; exit 1; }
  fi
  "$PY" -m pip install -q "$wheel[server]" 2>&1 | grep -v "^WARNING: Location" || true
fi
"$PY" -c "import llama_cpp.server, uvicorn" \
  || { echo "setup_llm: llama-cpp-python[server] did not install" >&2; exit 1; }

for model in "${@:-smollm2}"; do
  .venv/bin/traceap llm fetch --model "$model"
done
