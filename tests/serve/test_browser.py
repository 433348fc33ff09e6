"""The page at ``/`` in headless Chromium (Debian's ``chromium`` + ``chromium-driver``, driven by selenium):
a file uploaded through it is transcribed with word timings, and a (fake) microphone streamed over the
realtime WebSocket is transcribed when stopped.  The server runs the embedded Whisper tiny.en; the
speech is beckett.wav.  A screenshot of the page goes to docs/browser.png when OASR_SCREENSHOT is set."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from oasr.engine import Engine, EngineConfig
from tests.models.hf.whisper import _helpers as h
from tests.serve.harness import serving

CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def beckett() -> Path:
    try:
        import moonshine_onnx
    except ImportError:
        pytest.fail("useful-moonshine-onnx (beckett.wav) is not installed: pip install --no-deps useful-moonshine-onnx")
    return Path(moonshine_onnx.__file__).parent / "assets" / "beckett.wav"


@pytest.fixture(scope="module")
def server():
    with serving(Engine(EngineConfig()), served_model_names=("whisper-tiny.en",)) as s:
        yield s


@pytest.fixture()
def browser(beckett, tmp_path):
    if not (Path(CHROMIUM).is_file() and Path(DRIVER).is_file()):
        pytest.fail("Chromium is required: apt-get install -y chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1000,900", f"--user-data-dir={tmp_path / 'profile'}",
                 "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                 f"--use-file-for-fake-audio-capture={beckett}", "--autoplay-policy=no-user-gesture-required"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _wait_for(driver, predicate, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate(driver)
        if value:
            return value
        time.sleep(0.25)
    status = driver.find_element("id", "status").text
    raise AssertionError(f"timed out waiting for {what}; page status: {status!r}")


def test_upload_shows_the_transcript_and_word_timings(server, browser, beckett):
    browser.get(server.url + "/")
    _wait_for(browser, lambda d: "whisper-tiny.en" in d.find_element("id", "model").text, "the model list")
    browser.find_element("id", "file").send_keys(str(beckett))
    browser.find_element("id", "upload").click()
    text = _wait_for(browser, lambda d: d.find_element("id", "transcript").text, "the transcript")
    assert h.wer(h.BECKETT_TEXT, text) <= 0.4, text
    rows = browser.find_elements("css selector", "#words tbody tr")
    cells = [[c.text for c in r.find_elements("tag name", "td")] for r in rows]
    assert len(cells) >= 8
    starts = [float(c[1]) for c in cells]
    assert starts == sorted(starts) and all(float(c[2]) >= float(c[1]) for c in cells)
    assert "fail" in " ".join(c[0].lower() for c in cells)
    if os.environ.get("OASR_SCREENSHOT"):
        browser.save_screenshot(os.environ["OASR_SCREENSHOT"])


def test_microphone_streams_over_the_realtime_websocket(server, browser):
    browser.get(server.url + "/")
    _wait_for(browser, lambda d: "whisper-tiny.en" in d.find_element("id", "model").text, "the model list")
    browser.find_element("id", "start").click()
    _wait_for(browser, lambda d: "listening" in d.find_element("id", "micstatus").text, "the microphone")
    time.sleep(11)  # beckett.wav is 10 s: the fake microphone plays it once through
    browser.find_element("id", "stop").click()
    _wait_for(browser, lambda d: d.find_element("id", "status").text == "completed", "the completed event")
    text = browser.find_element("id", "transcript").text
    assert h.wer(h.BECKETT_TEXT, text) <= 0.5, text


def test_api_reference_is_served(server):
    import httpx

    assert httpx.get(server.url + "/docs").status_code == 200
    assert "OASR" in httpx.get(server.url + "/").text
    assert shutil.which("chromium") or Path(CHROMIUM).is_file()
