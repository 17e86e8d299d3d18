"""The chat page at `/` of a real `tr serve` on the packaged model, in headless Chromium driven by
selenium: the reply streams in, the draft view fills with accepted drafted tokens, Enter sends and
Shift+Enter breaks a line, Stop ends the decode (the server logs the client leaving and is free at
once), a reload finds the conversation, Regenerate answers again from the cached prompt; the
settings (system prompt, sampling, the draft view) go with each request and outlive a reload, the
last message can be edited; every control has a name and the focus moves in reading order; at a
phone's width nothing is wider than the screen and the closed conversation list takes no focus;
and on a server with --api-key the page asks for the key (again when it is wrong) and then works.

Needs Debian's `chromium` and `chromium-driver` (.ci/run installs them); skipped without."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import new_home

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
BIN = Path(sys.executable).parent
LISTENING = re.compile(r"tr serve: listening on (http://\S+)/v1 \(model '")
API_KEY = "sk-web-7d1e"
WAIT = 300  # seconds for a reply: this 2-core VM shared by other runs gave 0.3 tok/s at times
# The paper's tree: drafts are verified from the first step (a tree designed on a busy CPU can be
# one node) and the start measures no step costs.
SERVE_ARGS = ("smollm2", "--tree", "paper", "--max-new-tokens", "400")

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="no /usr/bin/chromium and /usr/bin/chromedriver (apt-get install chromium chromium-driver)",
)


class Serve:
    """A `tr serve` process on a free port, its stderr in a file."""

    def __init__(self, home: Path, log: Path, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("TR_API_KEY", "FORCE_COLOR")}
        env.update(HF_HUB_OFFLINE="1", TR_HOME=str(home), NO_COLOR="1", COLUMNS="200")
        self.log = log
        with log.open("wb") as sink:
            self.proc = subprocess.Popen(
                [str(BIN / "tr"), "serve", *SERVE_ARGS, *args, "--port", "0"],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
                env=env,
                start_new_session=True,
            )
        self.url = ""

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_listening(self, timeout: float = 300) -> Serve:
        if self.url:
            return self
        deadline = time.monotonic() + timeout
        while not (found := LISTENING.search(self.stderr())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"tr serve did not start; stderr:\n{self.stderr()}")
            time.sleep(0.1)
        self.url = found.group(1)
        return self

    def busy(self) -> bool:
        with urllib.request.urlopen(self.url + "/health", timeout=10) as response:
            return json.load(response)["busy"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def web_home(root: Path, name: str, gguf_cache: Path) -> Path:
    """A fresh home sharing the run's kernels and converted GGUF, and with the other server here
    the int4 weights quantized at a start."""
    home = new_home(root / name, gguf_cache)
    (root / "quantized").mkdir(exist_ok=True)
    (home / "cache" / "quantized").symlink_to(root / "quantized", target_is_directory=True)
    return home


@pytest.fixture(scope="module")
def servers(tmp_path_factory, gguf_cache):
    """An open server, then one with a key: the second starts once the first has built what both
    need (kernels, conversion, quantized weights) and loads while the first test runs; the key
    test waits for it."""
    root = tmp_path_factory.mktemp("web")
    open_server = Serve(web_home(root, "home-open", gguf_cache), root / "open.log")
    keyed = None
    try:
        open_server.wait_listening()
        keyed = Serve(web_home(root, "home-keyed", gguf_cache), root / "keyed.log", "--api-key", API_KEY)
        yield open_server, keyed
    finally:
        open_server.stop()
        if keyed is not None:
            keyed.stop()


@pytest.fixture()
def browser():
    profile = tempfile.mkdtemp(prefix="tr-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver, condition, timeout: float = WAIT, message: str = ""):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: condition(d), message)


def replies(driver) -> list:
    return driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")


def reply_text(driver, index: int = -1) -> str:
    return replies(driver)[index].find_element(By.CSS_SELECTOR, ".bubble").text


def idle(driver) -> bool:
    return driver.find_element(By.ID, "send").is_displayed()


def click_in_view(driver, element) -> None:
    """Click once the element is in view: the messages scroll smoothly (CSS), so the scroll Selenium
    does before a click is still under way when it clicks, at the element's old place."""
    driver.execute_script("arguments[0].scrollIntoView({block: 'center', behavior: 'instant'})", element)
    element.click()


def set_max_tokens(driver, value: int) -> None:
    driver.find_element(By.ID, "toggle-settings").click()
    field = driver.find_element(By.ID, "max_tokens")
    field.clear()
    field.send_keys(str(value))
    driver.find_element(By.ID, "toggle-settings").click()


def test_a_conversation_streams_shows_its_drafts_stops_and_survives_a_reload(servers, browser):
    server, _ = servers
    browser.get(server.url + "/")
    wait(browser, lambda d: d.find_element(By.ID, "model").text == "smollm2", 30, "the model's name")
    prompt = browser.find_element(By.ID, "prompt")
    assert browser.switch_to.active_element == prompt  # focus starts in the message box

    # Shift+Enter breaks the line; Enter sends.
    prompt.send_keys("Write a Python function")
    prompt.send_keys(Keys.SHIFT, Keys.ENTER)
    prompt.send_keys("that reverses a string.")
    assert prompt.get_attribute("value") == "Write a Python function\nthat reverses a string."
    assert not replies(browser)
    set_max_tokens(browser, 40)
    prompt.send_keys(Keys.ENTER)

    # The reply streams in: text shows while Stop is still offered, and it grows.
    seen = wait(browser, lambda d: (not idle(d)) and reply_text(d), message="streamed text before the end")
    wait(browser, idle, message="the reply to end")
    final = reply_text(browser)
    assert final.startswith(seen) and len(final) > len(seen), (seen, final)
    user = browser.find_elements(By.CSS_SELECTOR, ".msg.user .bubble")[0].text
    assert user == "Write a Python function\nthat reverses a string."

    # The draft view: steps with accepted drafted tokens (coloured by source) and the model's own.
    reply = replies(browser)[-1]
    accepted = reply.find_elements(By.CSS_SELECTOR, ".drafts .step .tok:not(.bonus)")
    assert accepted, "no drafted token was accepted"
    assert all(re.search(r"\bsrc-(matrix|lookup|store|grammar|text)\b", t.get_attribute("class")) for t in accepted)
    summary = reply.find_element(By.CSS_SELECTOR, ".drafts summary").text
    assert re.search(r"\d+ steps? · \d+/\d+ tokens? drafted · MAT \d+\.\d\d · [\d.]+ tok/s", summary), summary
    assert "MAT" in reply.find_element(By.CSS_SELECTOR, ".stats").text
    assert reply.find_elements(By.CSS_SELECTOR, ".codeblock pre code"), "the code is not shown as code"
    click_in_view(browser, reply.find_elements(By.CSS_SELECTOR, ".drafts .step")[1])  # a step's drafted tree
    assert reply.find_elements(By.CSS_SELECTOR, ".detail .tree .tok.rejected")

    # Stop mid-reply: the decode ends, the server logs the client leaving and is free at once.
    set_max_tokens(browser, 400)
    prompt.send_keys("Write a long story about a lighthouse keeper and the sea.", Keys.ENTER)
    streaming = lambda d: len(replies(d)) == 2 and len(reply_text(d)) > 20 and not idle(d)  # noqa: E731
    wait(browser, streaming, message="a streaming reply")
    browser.find_element(By.ID, "stop").click()
    wait(browser, idle, 10, "the page to stop")
    stopped = reply_text(browser)
    assert replies(browser)[-1].find_element(By.CSS_SELECTOR, ".stopped").text == "Stopped."
    deadline = time.monotonic() + 10
    while server.busy():
        assert time.monotonic() < deadline, "the server went on decoding after Stop"
        time.sleep(0.05)
    assert re.search(r'"POST /v1/chat/completions" 499 · the client left mid-stream', server.stderr())

    # A reload finds the conversation, its stopped reply and its draft view.
    browser.refresh()
    wait(browser, lambda d: len(replies(d)) == 2, 15, "the conversation after a reload")
    assert reply_text(browser, 0) == final and reply_text(browser, 1) == stopped
    titles = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#conversations .open")]
    assert titles == ["Write a Python function that reverses a string."]
    assert replies(browser)[0].find_elements(By.CSS_SELECTOR, ".drafts .step .tok:not(.bonus)")

    # Regenerate the stopped reply: the prompt comes from the cache (the server is greedy).
    click_in_view(browser, browser.find_element(By.CSS_SELECTOR, "button[aria-label='Regenerate the last reply']"))
    wait(browser, lambda d: not idle(d), 10, "the regenerated reply to start")
    wait(browser, lambda d: len(reply_text(d)) > len(stopped) + 10, message="the regenerated reply")
    browser.find_element(By.ID, "stop").click()
    wait(browser, idle, 10, "the page to stop")
    assert reply_text(browser).startswith(stopped)  # greedy: the same start again


# Every request body the page sends, kept in the page (the page calls the global fetch each time).
RECORD_REQUESTS = """
window.sentBodies = [];
const fetchBefore = window.fetch;
window.fetch = (url, options) => {
  if (options && options.body) window.sentBodies.push(JSON.parse(options.body));
  return fetchBefore(url, options);
};
"""


def sent_bodies(driver) -> list[dict]:
    return driver.execute_script("return window.sentBodies")


def focus_order(driver, start: str, presses: int) -> list[str]:
    """The elements Tab reaches from the one `start` selects: their ids, or tag(.class)."""
    driver.execute_script("document.querySelector(arguments[0]).focus()", start)
    name = "const e = document.activeElement; return e.id || [e.localName, e.className].filter(Boolean).join('.')"
    order = [driver.execute_script(name)]
    for _ in range(presses):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        order.append(driver.execute_script(name))
    return order


def test_settings_go_with_each_request_and_outlive_a_reload_and_the_last_message_can_be_edited(servers, browser):
    server, _ = servers
    browser.get(server.url + "/")
    wait(browser, lambda d: d.find_element(By.ID, "model").text == "smollm2", 30, "the model's name")

    # Every control has a name a screen reader reads; Tab goes through the page in reading order.
    browser.find_element(By.ID, "toggle-settings").click()  # its controls shown too
    controls = browser.find_elements(By.CSS_SELECTOR, "button, input, textarea, summary, a[href]")
    assert len([c for c in controls if c.is_displayed()]) >= 15
    for control in controls:
        if control.is_displayed():  # a hidden one (Stop, the key dialog's) has no computed name
            assert control.accessible_name.strip(), control.get_attribute("outerHTML")
    browser.find_element(By.ID, "toggle-settings").click()
    suggestions = ["button"] * 3
    order = focus_order(browser, ".skip-link", 7)
    assert order == ["a.skip-link", "new-chat", "toggle-settings", *suggestions, "prompt", "send"], order
    browser.find_element(By.ID, "toggle-settings").click()
    assert browser.switch_to.active_element == browser.find_element(By.ID, "system")
    order = focus_order(browser, "#system", 8)
    assert order[1:] == [
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "max_tokens",
        "seed",
        "show-drafts",
        *suggestions[:1],
    ]

    # The system prompt and the sampling settings go with the request.
    settings = {
        "temperature": "0.5",
        "top_p": "0.9",
        "top_k": "20",
        "repetition_penalty": "1.1",
        "max_tokens": "6",
        "seed": "7",
    }
    browser.find_element(By.ID, "system").send_keys("Answer in one short sentence.")
    for name, value in settings.items():
        browser.find_element(By.ID, name).send_keys(value)
    browser.find_element(By.ID, "toggle-settings").click()
    browser.execute_script(RECORD_REQUESTS)
    browser.find_element(By.ID, "prompt").send_keys("Name a colour.", Keys.ENTER)
    wait(browser, lambda d: replies(d) and idle(d) and d.find_elements(By.CSS_SELECTOR, ".msg.assistant .stats"))
    [body] = sent_bodies(browser)
    assert body["messages"] == [
        {"role": "system", "content": "Answer in one short sentence."},
        {"role": "user", "content": "Name a colour."},
    ]
    assert {name: body[name] for name in settings} == {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "repetition_penalty": 1.1,
        "max_tokens": 6,
        "seed": 7,
    }
    assert body["stream"] is True and body["tr"] == {"steps": True} and body["model"] == "smollm2"
    assert not replies(browser)[-1].find_elements(By.CSS_SELECTOR, ".error")

    # A reload keeps the settings (localStorage); without the draft view the page asks for no steps.
    browser.refresh()
    wait(browser, lambda d: len(replies(d)) == 1, 15, "the conversation after a reload")
    assert browser.find_element(By.ID, "system").get_attribute("value") == "Answer in one short sentence."
    assert {name: browser.find_element(By.ID, name).get_attribute("value") for name in settings} == settings
    browser.find_element(By.ID, "toggle-settings").click()
    browser.find_element(By.ID, "show-drafts").click()
    browser.find_element(By.ID, "toggle-settings").click()

    # Edit the last message: the reply after it is replaced, the earlier history is what is sent.
    browser.execute_script(RECORD_REQUESTS)
    click_in_view(browser, browser.find_element(By.CSS_SELECTOR, "button[aria-label='Edit your last message']"))
    editor = browser.find_element(By.CSS_SELECTOR, "textarea[aria-label='Edit your message']")
    assert browser.switch_to.active_element == editor and editor.get_attribute("value") == "Name a colour."
    editor.clear()
    editor.send_keys("Name a fruit.", Keys.ENTER)
    wait(
        browser,
        lambda d: idle(d) and d.find_elements(By.CSS_SELECTOR, ".msg.assistant .stats"),
        message="the edit's reply",
    )
    [body] = sent_bodies(browser)
    assert [m["content"] for m in body["messages"]] == ["Answer in one short sentence.", "Name a fruit."]
    assert "tr" not in body
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".msg.user .bubble")] == ["Name a fruit."]
    assert len(replies(browser)) == 1 and not replies(browser)[0].find_elements(By.CSS_SELECTOR, ".drafts")
    titles = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#conversations .open")]
    assert titles == ["Name a fruit."]


LONG_STEP = [{"text": f" word{n}", "source": "matrix" if n % 3 else "store"} for n in range(40)]
# A conversation as the page keeps it: a reply whose one step accepted 40 drafts, a word longer
# than a phone is wide, a long code line.
SAVED = {
    "current": "c1",
    "conversations": [
        {
            "id": "c1",
            "title": "A long reply",
            "created": 0,
            "messages": [
                {"role": "user", "content": "Say something long."},
                {
                    "role": "assistant",
                    "model": "smollm2",
                    "draftsOpen": True,
                    "content": "Here: " + "x" * 120 + "\n\n```python\nprint('" + "y" * 150 + "')\n```",
                    "steps": [
                        {
                            "index": 0,
                            "ms": 10,
                            "drafted": {},
                            "new_tokens": 1,
                            "mean_accepted_tokens": 1,
                            "tokens_per_second": 50,
                            "accepted": [],
                            "bonus": {"text": "Here"},
                        },
                        {
                            "index": 1,
                            "ms": 20,
                            "drafted": {"matrix": 30, "store": 20},
                            "new_tokens": 41,
                            "mean_accepted_tokens": 21,
                            "tokens_per_second": 700,
                            "accepted": LONG_STEP,
                            "bonus": {"text": ":"},
                        },
                    ],
                    "stats": {"steps": 1, "mean_accepted_tokens": 21, "tokens_per_second": 700, "prefill_tokens": 1},
                    "usage": {"completion_tokens": 42},
                },
            ],
        }
    ],
}


def test_at_a_phones_width_nothing_is_wider_than_the_screen_and_the_closed_list_takes_no_focus(servers, browser):
    server, _ = servers
    metrics = {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True}
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    browser.get(server.url + "/")
    browser.execute_script("localStorage.setItem('tr.chat.conversations.v1', arguments[0])", json.dumps(SAVED))
    browser.refresh()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".drafts .step"), 15, "the saved conversation")
    assert browser.execute_script("return window.innerWidth") == 390

    # Nothing sticks out sideways: the page, the messages, the draft view's steps (a step of 40
    # tokens wraps inside its frame); only a code block scrolls inside itself.
    wide = """
      const over = (e) => e.scrollWidth > e.clientWidth + 1;
      const inside = document.querySelectorAll('.messages, .msg, .bubble, .drafts, .steps, .step');
      return [document.documentElement, ...inside].filter(over).map((e) => e.className || e.tagName);
    """
    assert browser.execute_script(wide) == []
    strip = browser.find_element(By.CSS_SELECTOR, ".drafts .steps")
    right = strip.rect["x"] + strip.rect["width"]
    assert all(s.rect["x"] + s.rect["width"] <= right + 1 for s in strip.find_elements(By.CSS_SELECTOR, ".step"))
    stats = replies(browser)[0].find_element(By.CSS_SELECTOR, ".stats").text
    summary = replies(browser)[0].find_element(By.CSS_SELECTOR, ".drafts summary").text
    assert "42 tokens" in stats and "1 step ·" in summary and "prefill 1 token" in stats, (stats, summary)
    assert "1 steps" not in stats + summary and "1 tokens" not in stats + summary, (stats, summary)

    # The conversation list is closed behind the menu button: Tab skips it; opened, it takes the
    # focus; Esc closes it and gives the focus back.
    menu = browser.find_element(By.ID, "toggle-sidebar")
    assert menu.is_displayed() and not browser.find_element(By.ID, "keys-hint").is_displayed()
    assert not browser.find_element(By.ID, "new-chat").is_displayed()
    assert focus_order(browser, ".skip-link", 1)[1] == "toggle-sidebar"
    menu.click()
    wait(browser, lambda d: d.find_element(By.ID, "new-chat").is_displayed(), 5, "the conversations shown")
    assert browser.switch_to.active_element == browser.find_element(By.ID, "new-chat")
    ActionChains(browser).send_keys(Keys.ESCAPE).perform()
    wait(browser, lambda d: not d.find_element(By.ID, "new-chat").is_displayed(), 5, "the conversations hidden")
    assert browser.switch_to.active_element == menu and menu.get_attribute("aria-expanded") == "false"


def test_the_page_asks_for_the_api_key_and_keeps_it_for_the_tab(servers, browser):
    server = servers[1].wait_listening()
    browser.get(server.url + "/")
    dialog = browser.find_element(By.ID, "key-dialog")
    wait(browser, lambda d: dialog.get_attribute("open") is not None, 30, "the key dialog")
    key = browser.find_element(By.ID, "key-input")
    assert browser.switch_to.active_element == key
    key.send_keys("wrong", Keys.ENTER)
    wait(browser, lambda d: "refused" in d.find_element(By.ID, "key-why").text, 15, "the wrong key refused")
    key.send_keys(API_KEY, Keys.ENTER)
    wait(browser, lambda d: d.find_element(By.ID, "model").text == "smollm2", 15, "the model's name")
    set_max_tokens(browser, 8)
    browser.find_element(By.ID, "prompt").send_keys("Say hello.", Keys.ENTER)
    wait(browser, lambda d: replies(d) and idle(d) and reply_text(d), message="a reply behind the key")
    assert not replies(browser)[-1].find_elements(By.CSS_SELECTOR, ".error")
    browser.refresh()  # the key stays for the tab: no dialog again
    wait(browser, lambda d: d.find_element(By.ID, "model").text == "smollm2", 15, "the model's name")
    assert browser.find_element(By.ID, "key-dialog").get_attribute("open") is None
