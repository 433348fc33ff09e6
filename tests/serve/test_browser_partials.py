"""The page at ``/`` in headless Chromium shows a partial transcript while the (fake) microphone is still
recording on an offline engine (the embedded Whisper tiny.en), before the buffer is committed."""

from __future__ import annotations

import time

import pytest

from oasr.engine import Engine, EngineConfig
from tests.models.hf.whisper import _helpers as h
from tests.serve.harness import serving
from tests.serve.test_browser import _wait_for, beckett, browser  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def server():
    with serving(Engine(EngineConfig()), served_model_names=("whisper-tiny.en",)) as s:
        yield s


def test_partials_show_while_the_microphone_records(server, browser):  # noqa: F811
    browser.get(server.url + "/")
    _wait_for(browser, lambda d: "whisper-tiny.en" in d.find_element("id", "model").text, "the model list")
    browser.find_element("id", "start").click()
    started = time.monotonic()
    _wait_for(browser, lambda d: "listening" in d.find_element("id", "micstatus").text, "the microphone")
    partial = _wait_for(browser, lambda d: d.find_element("id", "partial").text.strip(), "a partial transcript",
                        timeout=60)
    # still recording: the stop button (which commits) has not been pressed, nothing is completed
    assert browser.find_element("id", "stop").is_enabled()
    assert browser.find_element("id", "status").text != "completed"
    assert browser.find_element("id", "transcript").text == ""
    words = set(h.normalize_words(partial))
    assert words & set(h.normalize_words(h.BECKETT_TEXT)), partial
    time.sleep(max(0.0, 11 - (time.monotonic() - started)))  # beckett.wav (10 s) plays once through
    browser.find_element("id", "stop").click()
    _wait_for(browser, lambda d: d.find_element("id", "status").text == "completed", "the completed event")
    assert browser.find_element("id", "partial").text == ""
    assert h.wer(h.BECKETT_TEXT, browser.find_element("id", "transcript").text) <= 0.5
