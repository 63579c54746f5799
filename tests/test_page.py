"""The attention page in a real browser: scripts/serve.py runs as its own process on a free
loopback port, headless Chromium (Debian's `chromium`, driven by Playwright) types a
sentence, presses Translate, waits for the translation and counts the heatmaps of the chosen
layer: one per remaining head, the pruned ones drawn as absent. A screenshot is saved in the
test's temporary directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PRUNED_HEADS, free_port, wait_until_up
from playwright.sync_api import sync_playwright

from transformer.decoding.translator import Translator

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "serve.py"
SENTENCE = "Two dogs play in the snow."


def chromium() -> str:
    """Debian's Chromium (`apt-get install chromium`; .ci/run installs it)."""
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    pytest.fail("this test drives the page in headless Chromium: apt-get install chromium",
                pytrace=False)


def launch(playwright):
    """Headless Chromium as CI can run it: as root (no sandbox), with a small /dev/shm."""
    return playwright.chromium.launch(executable_path=chromium(),
                                      args=["--no-sandbox", "--disable-dev-shm-usage"])


@pytest.fixture(scope="module")
def server(pruned_checkpoint, tmp_path_factory):
    """scripts/serve.py serving the pruned random model; yields its base URL."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SCRIPT.parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--checkpoint", str(pruned_checkpoint), "--port",
             str(port), "--threads", "1", "--device", "cpu"],
            stdout=output, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(process, url, log)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_page_translates_and_draws_one_heatmap_per_head(server, pruned_checkpoint, tmp_path):
    translator = Translator.load(pruned_checkpoint, device="cpu")
    expected = translator.translate([SENTENCE])[0]
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            errors = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(server)
            page.fill("#source", SENTENCE)
            page.click("#translate")
            page.wait_for_selector("body[data-state=ready]", timeout=60_000)
            assert page.inner_text("#translations li .source") == SENTENCE
            assert page.inner_text("#translations li").endswith(expected)

            # The default view: the last decoder layer's encoder-decoder attention, which
            # lost heads 1 and 3: two heatmaps, two absent heads.
            assert page.input_value("#kind") == "enc-dec"
            assert page.input_value("#layer") == "1"
            pruned = PRUNED_HEADS["decoder.blks.1.attention2"]
            assert page.locator("canvas.heatmap").count() == 4 - len(pruned)
            assert [int(h) for h in page.locator("figure.pruned").evaluate_all(
                "figures => figures.map(f => f.dataset.head)")] == pruned
            page.screenshot(path=str(tmp_path / "enc-dec-1.png"), full_page=True)

            page.select_option("#layer", "0")  # an unpruned layer: all four heads
            assert page.locator("canvas.heatmap").count() == 4
            assert page.locator("figure.pruned").count() == 0
            page.select_option("#kind", "enc-self")
            page.select_option("#layer", "0")  # lost head 0
            assert page.locator("canvas.heatmap").count() == 3
            assert page.locator("figure.pruned").count() == 1

            first = page.locator("canvas.heatmap").first  # the tooltip names head and weight
            box = first.bounding_box()
            first.hover(position={"x": box["width"] - 3, "y": box["height"] - 3})
            tooltip = page.inner_text("#tooltip")
            assert page.is_visible("#tooltip") and tooltip.startswith("head 1: </s> → </s>: ")
            float(tooltip.rsplit(": ", 1)[1])
            page.screenshot(path=str(tmp_path / "enc-self-0.png"), full_page=True)
            assert errors == []
        finally:
            browser.close()
    for name in ("enc-dec-1.png", "enc-self-0.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")


def test_page_shows_the_servers_message_for_bad_input(server):
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page()
            page.goto(server)
            page.fill("#source", "a" * 1001)
            page.click("#translate")
            page.wait_for_selector("body[data-state=error]", timeout=60_000)
            assert "text[0]" in page.inner_text("#status")
            page.fill("#source", SENTENCE)  # and it goes on working
            page.click("#translate")
            page.wait_for_selector("body[data-state=ready]", timeout=60_000)
            assert page.locator("canvas.heatmap").count() == 2
        finally:
            browser.close()


def serving(checkpoint: Path, log: Path):
    """scripts/serve.py serving `checkpoint` on a free port: (process, URL)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SCRIPT.parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--checkpoint", str(checkpoint), "--port",
             str(port), "--threads", "1", "--device", "cpu"],
            stdout=output, stderr=subprocess.STDOUT, env=env)
    return process, f"http://127.0.0.1:{port}"


def test_page_asks_a_multilingual_model_for_its_target_language(multi30k_lines, tmp_path):
    """A model trained into de and fr: the page offers both, sends the chosen one, and
    shows the translation into it and its attention."""
    from test_target_lang import MULTILINGUAL, TAGS, save

    from transformer.data.tokenizer import Tokenizer

    texts = multi30k_lines("train.en.gz")[:1000] + multi30k_lines("train.de.gz")[:1000]
    checkpoint = save(Tokenizer.train(texts, vocab_size=500, tags=TAGS), MULTILINGUAL,
                      tmp_path / "multi.pt")
    expected = Translator.load(checkpoint, device="cpu").translate([SENTENCE],
                                                                   target_lang="fr")[0]
    assert expected  # a random model's words, which the page must show
    process, url = serving(checkpoint, tmp_path / "server.log")
    try:
        wait_until_up(process, url, tmp_path / "server.log")
        with sync_playwright() as playwright:
            browser = launch(playwright)
            try:
                page = browser.new_page()
                page.goto(url)
                page.wait_for_selector("#target-lang-label:not([hidden])", timeout=60_000)
                assert page.locator("#target-lang option").all_inner_texts() == ["de", "fr"]
                page.select_option("#target-lang", "fr")
                page.fill("#source", SENTENCE)
                page.click("#translate")
                page.wait_for_selector("body[data-state=ready]", timeout=60_000)
                assert page.inner_text("#translations li").endswith(expected)
                assert "de, fr" in page.inner_text("#model-info")
            finally:
                browser.close()
    finally:
        process.terminate()
        process.wait(timeout=30)
