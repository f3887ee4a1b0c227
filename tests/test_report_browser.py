"""report.html opened in headless Chromium (issue 9): every plot loads, long cells start collapsed.

Needs Debian's chromium (`apt-get install chromium`; .ci/run installs it where it can) and the
`playwright` Python package from the test extra; skipped with the reason otherwise."""

import shutil

import pytest

from rlhfkit.eval.report import image_html, table_html, write_report
from rlhfkit.plots import plot_curves

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Chromium's own background traffic is refused on machines without network; keep it quiet and quick
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed: apt-get install chromium")
def test_report_renders_with_every_plot_loaded_and_long_posts_collapsed(tmp_path):
    rows = [{"step": i, "train/loss": 1 / (i + 1), "val/loss": 1.2 / (i + 1)} for i in range(6)]
    plots = [plot_curves(rows, ["train/loss"], tmp_path / "plots" / "a.png", "A"),
             plot_curves(rows, ["train/loss", "val/loss"], tmp_path / "plots" / "b.png", "B")]
    post = "\n".join(f"paragraph {i} of a long post" for i in range(12))
    sections = [(f"plot {i}", image_html(p)) for i, p in enumerate(plots)]
    sections.append(("Samples", table_html([{"post": post, "summary": "short"}], ["post", "summary"])))
    report = write_report(tmp_path, "Report", sections)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.goto(report.as_uri())
            page.wait_for_load_state("load")
            assert page.evaluate("document.images.length") == 2
            assert page.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
            assert page.evaluate("document.querySelectorAll('details').length") == 1
            assert page.evaluate("document.querySelector('details').open") is False
            assert "paragraph 0" in page.inner_text("summary") and "paragraph 11" not in page.inner_text("summary")
        finally:
            browser.close()
