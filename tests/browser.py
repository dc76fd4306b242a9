"""Open a page in a real headless Chromium (driven by Playwright) and report what a reader
would see go wrong: console errors, uncaught exceptions, charts that did not draw.

Chromium is the system's (`apt install chromium`, or $CHROMIUM); where there is none the
caller skips, naming what is missing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# What a headless Chromium needs on a closed network, as root, with no GPU.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str | None:
    """The path of a Chromium to drive, or None."""
    named = os.environ.get("CHROMIUM")
    if named:
        return named
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def open_pages(paths: list[Path], script: str, ready: str = "true", timeout_ms: int = 30_000) -> dict[Path, dict]:
    """For each file: {"errors": console errors and uncaught exceptions, "result": what
    `script` (a JavaScript function body) returned once `ready` (a JavaScript expression)
    held, or after `timeout_ms`: a loaded machine draws slowly, a broken chart never does}."""
    from playwright.sync_api import sync_playwright

    found = {}
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium(), args=FLAGS)
        try:
            for path in paths:
                page = browser.new_page()
                errors: list[str] = []
                page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
                page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
                page.goto(path.resolve().as_uri(), wait_until="load")
                try:
                    page.wait_for_function(ready, timeout=timeout_ms)
                except Exception:  # Playwright's TimeoutError: the result says what was drawn
                    pass
                found[path] = {"errors": errors, "result": page.evaluate(f"() => {{ {script} }}")}
                page.close()
        finally:
            browser.close()
    return found
