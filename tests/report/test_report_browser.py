"""Every kind of report.html opened in headless Chromium: the quick-start pipeline,
SFT, RM, PPO, eval, judge-eval and multi-run reports, each screenshotted full-page; every image
loads and is shown at no less than 60% of its drawn width at 1400 px (so a panel stays readable),
no cell reads None, inf or nan, every report has its caveats section, long cells start collapsed.

Needs Debian's chromium (`apt-get install chromium`; .ci/run installs it where it can) and the
`playwright` Python package from the test extra; skipped with the reason otherwise."""

import json
import shutil

import pytest

from rlhfkit.cli import main as cli_main

from ..support.data import first_lines
from ..support.tiny import cli_args, stage_args

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Chromium's own background traffic is refused on machines without network; keep it quiet and quick
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
BAD_CELLS = {"None", "none", "null", "inf", "-inf", "+inf", "nan", "NaN", "Infinity", "-Infinity"}
pytestmark = [
    pytest.mark.slow,  # a browser and a pipeline of its own: in the slow suite (.ci/run installs chromium for it)
    pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed: apt-get install chromium"),
]


@pytest.fixture(scope="module")
def reports(tmp_path_factory, tiny_model_dir):
    """One report of each kind, from a tiny quick-start pipeline, a judge-eval and a multi-run report."""
    root = tmp_path_factory.mktemp("reports")
    inputs = {"policy": tiny_model_dir,
              "posts": first_lines(root / "posts.jsonl", 40, "tldr-sft-sample", "tldr_sft_sample.jsonl.gz"),
              "pairs": first_lines(root / "pairs.jsonl", 60, "summarize-from-feedback-comparisons", "batch13.jsonl.gz")}
    pipe = root / "pipe"
    args = cli_args(stage_args("pipeline", inputs, pipe, judge=f"rm:{pipe / 'rm' / 'model'}"))
    assert cli_main(["pipeline", "--preset", "quickstart", *args]) == 0
    judged = root / "judge-eval"
    assert (
        cli_main(
            [
                "judge-eval",
                f"judge=rm:{pipe / 'rm' / 'model'}",
                f"data={inputs['pairs']}",
                f"out={judged}",
                "max_pairs=12",
                f"cache_dir={root / 'cache'}",
            ]
        )
        == 0
    )
    runs = root / "runs-report"
    assert cli_main(["report", f"runs={pipe / 'sft'},{pipe / 'ppo'}", f"out={runs}"]) == 0
    return {
        "quick start": pipe,
        "sft": pipe / "sft",
        "rm": pipe / "rm",
        "ppo": pipe / "ppo",
        "eval": pipe / "eval",
        "judge-eval": judged,
        "multi-run": runs,
    }


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()


@pytest.mark.parametrize("kind", ["quick start", "sft", "rm", "ppo", "eval", "judge-eval", "multi-run"])
def test_each_report_renders_every_image_readably_without_none_or_inf_cells(kind, reports, browser, tmp_path):
    folder = reports[kind]
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto((folder / "report.html").as_uri())
        page.wait_for_load_state("load")
        page.screenshot(path=str(tmp_path / "shot.png"), full_page=True)
        assert (tmp_path / "shot.png").stat().st_size > 10_000
        images = page.evaluate("Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, i.width])")
        assert all(complete and natural > 0 for _, complete, natural, _ in images), images
        shrunk = [(alt, natural, shown) for alt, _, natural, shown in images if shown < 0.6 * natural]
        assert not shrunk, f"panels too small to read at 1400 px: {shrunk}"
        cells = page.evaluate("Array.from(document.querySelectorAll('td')).map(c => c.innerText.trim())")
        assert cells and not BAD_CELLS & set(cells), sorted(BAD_CELLS & set(cells))
        headings = page.evaluate("Array.from(document.querySelectorAll('h2')).map(h => h.innerText)")
        assert "Caveats" in headings and "Run summary" in headings
        assert page.evaluate("Array.from(document.querySelectorAll('details')).every(d => !d.open)")
    finally:
        page.close()
    if kind in ("quick start", "sft", "rm", "ppo", "eval"):
        assert len(images) >= 1, f"{kind} report has no figure"


def test_the_quick_start_report_states_its_caveats_from_its_own_numbers(reports):
    record = json.loads((reports["quick start"] / "report.json").read_text())
    lines = "\n".join(record["caveats"])
    assert "at this budget the numbers show the machinery, not alignment" in lines
    html = (reports["quick start"] / "report.html").read_text()
    assert all(line.replace("'", "&#x27;") in html for line in record["caveats"])
