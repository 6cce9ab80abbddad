"""The chat page at / in a real headless browser (Debian's chromium driven by selenium) against `archrun serve`
on the real SmolLM2: a question typed and sent streams an answer into the page (the model's greedy reply, in
several pieces); the screenshot is kept as a test artifact and checked for the answer's text.

CI installs chromium and chromedriver (.ci/run); elsewhere the test skips when they are absent.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest
from support.live_server import live_server
from support.models import real_model

import archrun

webdriver = pytest.importorskip("selenium.webdriver")
ARTIFACTS = Path(os.environ.get("ARCHRUN_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
QUESTION = "What is the capital of France? Answer in one sentence."


@pytest.fixture(scope="module")
def browser():
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium and chromium-driver (.ci/run)")
        pytest.skip("chromium / chromedriver not installed")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1000,700",
                "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    drv = webdriver.Chrome(service=Service(driver), options=opts)
    yield drv
    drv.quit()


@pytest.fixture(scope="module")
def served():
    model = archrun.load(real_model("smollm2"))
    with live_server(model, parallel=1, api_key="page-key") as (url, _srv):
        yield model, url


def test_the_page_is_served_without_the_key(served):
    r = httpx.get(served[1] + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "/v1/chat/completions" in r.text and "script-src" in r.headers["content-security-policy"]
    assert httpx.get(served[1] + "/v1/models").status_code == 401


def test_a_question_streams_an_answer_into_the_page(served, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    model, url = served
    browser.get(url + "/")
    browser.execute_script("document.getElementById('temperature').value = '0';"
                           "document.getElementById('max-tokens').value = '24';"
                           "document.getElementById('api-key').value = 'page-key';")
    browser.find_element(By.ID, "prompt").send_keys(QUESTION)
    browser.find_element(By.ID, "send").click()
    WebDriverWait(browser, 120).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".assistant[data-done='true']"))
    answer = browser.find_element(By.CSS_SELECTOR, ".assistant")
    expected = archrun.chat(model, [{"role": "user", "content": QUESTION}], max_tokens=24, temperature=0).complete()
    assert answer.text == expected.text.strip() and "Paris" in answer.text
    assert int(answer.get_attribute("data-chunks")) >= 3  # it arrived in pieces, as they were generated
    assert "error" not in answer.get_attribute("class")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "chat_page.png"
    assert browser.save_screenshot(str(shot))
    assert _has_text(shot, answer.rect)


def _has_text(png: Path, rect: dict) -> bool:
    """Whether the answer's bubble in the screenshot holds text: dark glyph pixels on its light background."""
    from PIL import Image

    img = Image.open(png).convert("L")
    box = (int(rect["x"]), int(rect["y"]), int(rect["x"] + rect["width"]), int(rect["y"] + rect["height"]))
    histogram = img.crop(box).histogram()  # pixel counts by grey level
    total, dark = sum(histogram), sum(histogram[:100])
    return total > 0 and 0.01 < dark / total < 0.5
