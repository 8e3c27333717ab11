#!/usr/bin/env bash
# Remake docs/report_screenshot.png, the README's picture of the HTML report: the bundled sample
# trace, analysed with the default detector, rendered by headless Chromium.  Run it after any
# change to the report or to the findings, and commit the PNG.
#
#   bash scripts/make_screenshot.sh            # needs chromium (apt-get install chromium)
# Options (environment): PYTHON (default .venv/bin/python, else python3), CHROMIUM (default:
# chromium, chromium-browser or google-chrome on the PATH), WIDTH and HEIGHT of the window in
# CSS pixels (default 1280 x 1500).
set -euo pipefail
cd "$(dirname "$0")/.."

SAMPLE=examples/dlrm_a100_rank3.json.gz   # relative: the report shows this path, no one's home
OUT_PNG=docs/report_screenshot.png
WIDTH=${WIDTH:-1280}
HEIGHT=${HEIGHT:-1500}

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
BROWSER=${CHROMIUM:-}
if [ -z "$BROWSER" ]; then
  for b in chromium chromium-browser google-chrome; do
    if command -v "$b" >/dev/null 2>&1; then BROWSER=$b; break; fi
  done
fi
if [ -z "$BROWSER" ]; then
  echo "make_screenshot: no chromium found (apt-get install chromium, or set CHROMIUM=...)" >&2
  exit 2
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" TRACEAP_PROGRESS=0
# The default detector and classifier, as a new user runs it.
"$PY" -m traceap analyze "$SAMPLE" --html "$TMP/report.html" --quiet

# Headless, offline, no profile of its own left behind; the report needs no network.
"$BROWSER" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --hide-scrollbars --force-device-scale-factor=1 --user-data-dir="$TMP/profile" \
  --window-size="$WIDTH,$HEIGHT" --virtual-time-budget=5000 \
  --screenshot="$TMP/shot.png" "file://$TMP/report.html" >"$TMP/chromium.log" 2>&1 || {
    echo "make_screenshot: $BROWSER failed:" >&2
    tail -n 5 "$TMP/chromium.log" >&2
    exit 1
  }
[ -s "$TMP/shot.png" ] || { echo "make_screenshot: no screenshot written" >&2; exit 1; }
mv "$TMP/shot.png" "$OUT_PNG"
echo "make_screenshot: wrote $OUT_PNG (${WIDTH}x${HEIGHT}, $SAMPLE, default detector)"
