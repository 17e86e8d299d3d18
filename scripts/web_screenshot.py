"""The README's picture of the chat page (docs/images/web-chat.png): one question asked through
`tr serve`'s page in headless Chromium, the reply with its draft view, the step with the most
accepted drafts opened. Run it against a server on a quiet machine (the picture shows tokens/s):

    tr serve --tree paper+lookup10+store16 &
    python scripts/web_screenshot.py http://127.0.0.1:8000/ docs/images/web-chat.png

Needs selenium (the `test` extra) and Debian's chromium and chromium-driver.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

QUESTION = (
    "Write a Python function is_palindrome(word) that checks whether a word reads the same backwards, "
    "with a short docstring."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the page, e.g. http://127.0.0.1:8000/")
    parser.add_argument("output", help="the PNG to write")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--max-tokens", type=int, default=120)
    parser.add_argument("--size", default="1280x1400", help="the window, WIDTHxHEIGHT")
    args = parser.parse_args()
    width, height = (int(n) for n in args.size.split("x"))
    profile = tempfile.mkdtemp(prefix="tr-screenshot-")
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path="/usr/bin/chromedriver"))
    try:
        driver.get(args.url)
        time.sleep(1)
        driver.find_element(By.ID, "toggle-settings").click()
        field = driver.find_element(By.ID, "max_tokens")
        field.clear()
        field.send_keys(str(args.max_tokens))
        driver.find_element(By.ID, "toggle-settings").click()
        driver.find_element(By.ID, "prompt").send_keys(args.question, Keys.ENTER)
        deadline = time.monotonic() + 600
        while not driver.find_elements(By.CSS_SELECTOR, ".msg.assistant .stats"):
            if time.monotonic() > deadline:
                raise SystemExit("no reply within 600 s")
            time.sleep(0.3)
        steps = driver.find_elements(By.CSS_SELECTOR, ".drafts .step")
        best = max(steps, key=lambda step: len(step.find_elements(By.CSS_SELECTOR, ".tok:not(.bonus)")))
        best.click()
        driver.find_element(By.ID, "prompt").click()  # the focus ring back where a user types
        top = "const m = document.getElementById('messages'); m.style.scrollBehavior = 'auto'; m.scrollTop = 0"
        driver.execute_script(top)
        time.sleep(0.3)
        driver.save_screenshot(args.output)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
