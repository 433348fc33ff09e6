from __future__ import annotations

import pytest

from tests.vad import _audio


@pytest.fixture(scope="session")
def clips(tmp_path_factory):
    return _audio.sentence_clips(tmp_path_factory.mktemp("vad_espeak"))


@pytest.fixture(scope="session")
def recording(clips):
    """Eight sentences with silences from 0.15 s to 4 s between them (some shorter than the default
    2 s minimum silence, some longer), and silence at both ends."""
    return _audio.join(clips, [1.0, 0.15, 2.5, 0.6, 4.0, 1.2, 0.3, 3.0, 1.5])
