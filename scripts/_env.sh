# Shared set-up for scripts/demo.sh and scripts/test.sh: a virtualenv in .venv with torch (CPU build)
# and the OASR distributions installed editable.  Sourced, not run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="${OASR_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip "setuptools>=77" wheel 2>&1 | grep -v "is ignored" || true
# torch first and pinned: 2.13.0 is the CPU build on this kind of machine; anything unpinned would
# pull a multi-GB CUDA build.
"${PIP[@]}" install "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
install_oasr() {
    "${PIP[@]}" install -e ./oasr-core -e ./oasr-kernels -e ./oasr-models-wenet -e ./oasr-models-icefall \
        -e ./oasr-models-hf -e ./oasr-models-funasr "$@" 2>&1 | grep -v "is ignored" || true
}
