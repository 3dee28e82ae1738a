"""Measure a page's cold load in Chromium (Playwright): load-event time and bytes transferred.

    python scripts/measure_page_load.py URL USERNAME PASSWORD [PATH ...] [--runs N]

Signs in through the portal's form, then opens each path in a fresh browser context (an
empty cache) and prints the median load-event time and the bytes that came over the wire
(compressed sizes, headers included), with each JavaScript error the page raised.
"""

from __future__ import annotations

import argparse
import shutil
import statistics

from playwright.sync_api import sync_playwright

ARGS = ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-background-networking"]


def measure(browser, base: str, state: dict, path: str) -> tuple[float, int, list[str]]:
    """One cold load: a new context with the signed-in cookies and no cache."""
    context = browser.new_context(storage_state=state, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    cdp = context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
    received: list[int] = []
    cdp.on("Network.loadingFinished", lambda e: received.append(int(e["encodedDataLength"])))
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(base + path, wait_until="load")
    page.wait_for_timeout(300)  # let the last responses report their sizes
    load_ms = page.evaluate(
        "() => { const n = performance.getEntriesByType('navigation')[0];"
        " return n.loadEventEnd - n.startTime; }"
    )
    context.close()
    return float(load_ms), sum(received), errors


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("username")
    parser.add_argument("password")
    parser.add_argument("paths", nargs="*", default=["/dashboard/"])
    parser.add_argument("--runs", type=int, default=5)
    options = parser.parse_args()
    base = options.url.rstrip("/")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=ARGS)
        context = browser.new_context()
        page = context.new_page()
        page.goto(base + "/accounts/login/")
        page.fill("input[name=username]", options.username)
        page.fill("input[name=password]", options.password)
        page.click("button[type=submit]")
        page.wait_for_load_state("load")
        state = context.storage_state()
        context.close()
        for path in options.paths:
            runs = [measure(browser, base, state, path) for _ in range(options.runs)]
            load = statistics.median(r[0] for r in runs)
            size = statistics.median(r[1] for r in runs)
            errors = sorted({e for r in runs for e in r[2]})
            print(f"{path}: load event {load:.0f} ms, {size / 1024:.0f} KiB transferred"
                  f" (median of {len(runs)}); JS errors: {errors or 'none'}")  # fmt: skip
        browser.close()


if __name__ == "__main__":
    main()
