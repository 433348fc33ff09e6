#!/usr/bin/env bash
# Set up OASR and every reference implementation the tests compare against, then run the whole
# test suite.  Usage: scripts/test.sh [pytest args...]
source "$(dirname "$0")/_env.sh"
install_oasr -r requirements/test.txt
# Reference implementations that must not pull their full dependency trees:
#  - openai-whisper would pull ~1 GB of triton it does not need on CPU;
#  - PyPI has no torchaudio for torch 2.13; its pure-Python Kaldi compliance code is the fbank
#    reference, so its compiled libraries (built for another torch) are moved out of the package;
#  - pyctcdecode pins numpy<2, which the rest (Ray Data's pyarrow) cannot run with; it works on numpy 2.
"${PIP[@]}" install --no-deps "openai-whisper==20250625" "torchaudio==2.11.*" "useful-moonshine-onnx" \
    "pyctcdecode==0.5.0" 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" - <<'PY'
import pathlib, shutil, sysconfig
lib = pathlib.Path(sysconfig.get_paths()["purelib"]) / "torchaudio" / "lib"
if lib.is_dir():
    for so in lib.glob("*.so"):
        shutil.move(str(so), str(so) + ".disabled")
PY
# Test assets that live in PyPI wheels (no model hub): pyannote's 30 s two-speaker sample.
ASSETS="$ROOT/.cache/assets"
mkdir -p "$ASSETS"
if [ ! -f "$ASSETS/sample.wav" ]; then
    "${PIP[@]}" download --no-deps "pyannote-audio==4.0.7" -d "$ROOT/.cache/wheels" 2>&1 | grep -v "is ignored" || true
    "$VENV/bin/python" - "$ROOT/.cache/wheels" "$ASSETS" <<'PY'
import pathlib, sys, zipfile
wheels, assets = map(pathlib.Path, sys.argv[1:])
wheel = sorted(wheels.glob("pyannote_audio-*.whl"))[-1]
with zipfile.ZipFile(wheel) as zf:
    (assets / "sample.wav").write_bytes(zf.read("pyannote/audio/sample/sample.wav"))
PY
fi
# NeMo (the oracle of the .nemo archive tests) pins packages the main venv cannot take: it gets its own venv,
# and tests/models/hf/fastconformer/nemo_oracle.py runs in it as a subprocess.
NEMO_VENV="$ROOT/.cache/nemo-venv"
NEMO_PIN="nemo_toolkit[asr]==3.0.0"
if [ ! -f "$NEMO_VENV/.oasr-installed" ] || [ "$(cat "$NEMO_VENV/.oasr-installed")" != "$NEMO_PIN" ]; then
    [ -x "$NEMO_VENV/bin/python" ] || "$PYTHON" -m venv "$NEMO_VENV"
    NEMO_PIP=("$NEMO_VENV/bin/python" -m pip --disable-pip-version-check -q)
    "${NEMO_PIP[@]}" install "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
    "${NEMO_PIP[@]}" install "torch==2.13.0" "$NEMO_PIN" 2>&1 | grep -v "is ignored" || true
    if "$NEMO_VENV/bin/python" -c "import nemo.collections.asr" >/dev/null 2>&1; then
        echo "$NEMO_PIN" > "$NEMO_VENV/.oasr-installed"
    else
        echo "warning: $NEMO_PIN did not install in $NEMO_VENV; the .nemo archive tests will fail" >&2
    fi
fi
# espeak-ng speaks test sentences; sox converts; Debian's chromium (+ its driver) runs the browser test
# headless (never a browser download).  CI runs as root on Debian.
missing=()
command -v espeak-ng >/dev/null 2>&1 || missing+=(espeak-ng sox)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium chromium-driver)
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "warning: ${missing[*]} not installed; tests that need them will fail" >&2
    fi
fi
export OASR_TEST_ASSETS="$ASSETS"
# No test may reach a model hub: a missing asset or wheel must fail, not fetch.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
"$VENV/bin/ruff" check .
JUNIT="$ROOT/.cache/junit.xml"
rm -f "$JUNIT"
# Does this run select every test?  Then the per-module floor (tests/MIN_TESTS) applies: a run that
# silently lost tests (a module that stopped collecting, a fixture that skips) fails too.
full=1
for arg in "$@"; do
    case "$arg" in
        -k*|-m*|--lf|--last-failed|--deselect*|--sw|--stepwise|--co|--collect-only|--ignore*|--sw-skip) full=0 ;;
        -*) ;;
        *) if [ -e "${arg%%::*}" ]; then full=0; fi ;;
    esac
done
status=0
"$VENV/bin/python" -m pytest -n 2 --dist loadfile --junitxml="$JUNIT" "$@" || status=$?
if [ "$status" = "0" ] && [ "$full" = "1" ]; then
    "$VENV/bin/python" "$ROOT/scripts/test_floor.py" check "$JUNIT" || status=1
fi
exit "$status"
