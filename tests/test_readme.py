"""The README and docs/ against the repository: short, every link and image resolves, and
every generated block is what `make publish` renders from the committed files.

No test here compares a sentence with a measurement: figures appear only inside generated
blocks, so re-measuring on another machine changes the blocks (and `report` rewrites them),
never the prose. These check the project's own documents, so they run on a clean clone as
their own CI step (`make check-docs`), not in `make test` on a workspace the pipeline has
re-measured part of.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from pipeline.stages.report.blocks import GENERATED
from pipeline.stages.report.render import render_all

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)


def rendered():
    """What the report stage renders from the committed metrics and results."""
    bench = sorted((ROOT / "metrics" / "bench").glob("*.json"))  # as `python -m pipeline report` does
    return render_all(bench, ROOT / "metrics" / "codecs.json", ROOT / "results", README.read_text(), ROOT)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in HEADING.findall(text)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # code is not a link
    return LINK.findall(text)


def test_readme_is_short_and_shows_a_generated_chart_early():
    """At most 200 lines, counting the rows a user's own machines would add: the README shows
    up to `README_MACHINES` machines, each a headline row per data set and a bench-time line."""
    from pipeline.stages.report.data import collect_runs, newest
    from pipeline.stages.report.render import README_MACHINES

    lines = README.read_text().splitlines()
    machines = newest(collect_runs(sorted((ROOT / "metrics" / "bench").glob("*.json")), ROOT / "results"))
    datasets = {d for runs in machines.values() for d in runs} or {"mnist", "fashion-mnist"}
    room = max(0, README_MACHINES - len(machines)) * (len(datasets) + 1)
    assert len(lines) + room <= 200, f"{len(lines)} lines, and {room} more once a machine of yours is added"
    head = "\n".join(lines[:40])
    chart = re.search(r"<!-- generated: [\w-]+ -->\n!\[[^\]]+\]\((docs/img/[\w-]+\.svg)\)", head)
    assert chart, "no generated chart within the README's first 40 lines"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_and_images_resolve_inside_the_repository(page):
    assert links(page) or page.name != "README.md"
    for target in links(page):
        url = urlparse(target)
        if url.scheme in ("http", "https"):
            continue
        assert not url.scheme, f"{page.name}: {target}: only web links or files of this repository"
        path = (page.parent / unquote(url.path)).resolve() if url.path else page
        assert path.is_relative_to(ROOT), f"{page.name}: {target} points outside the repository"
        assert path.exists(), f"{page.name}: {target}: no such file"
        if url.fragment and path.suffix == ".md":
            assert url.fragment in anchors(path), f"{page.name}: {target}: no such heading in {path.name}"


def test_generated_blocks_are_current():
    """`make publish` would write exactly what is committed: the README's blocks, the
    results page and each chart's spec (the SVG is drawn from it)."""
    out, _ = rendered()
    stale = [line for line in out.readme.splitlines() if line not in README.read_text().splitlines()]
    assert out.readme == README.read_text(), f"README is stale (run `make publish`): {stale[:5]}"
    assert out.results == (ROOT / "docs" / "results.md").read_text(), "docs/results.md is stale"
    images = ROOT / "docs" / "img"
    from pipeline.core.atomic import MARKER

    assert {p.name for p in images.iterdir()} == {f"{n}{ext}" for n in out.specs for ext in (".vl.json", ".svg")} | {
        MARKER
    }
    for name, spec in out.specs.items():
        assert (images / f"{name}.vl.json").read_text() == spec, f"docs/img/{name}.vl.json is stale"
        assert ET.parse(images / f"{name}.svg").getroot().tag.endswith("svg")
    assert GENERATED.search(README.read_text())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_embed_block_holds_its_recorded_file(page):
    """An embedded command output is the recorded file, as tools/record_commands.py wrote it
    (it refills every page's blocks after recording)."""
    from pipeline.stages.report.blocks import embed

    assert embed(page.read_text(), ROOT) == page.read_text(), f"{page.name}: run tools/record_commands.py"


def test_every_embed_names_a_recorded_file():
    for page in PAGES:
        for name in re.findall(r"^<!-- (?:embed|include): (\S+) -->$", page.read_text(), re.MULTILINE):
            assert (ROOT / name).is_file(), f"{page.name}: {name}"


@pytest.mark.parametrize(
    "phrase",
    [
        "the team",
        "seed.md",
        "design outline",
        "before this work",
        "the issue",
        "earlier claim",
        "an earlier",
        "no longer",
        "this session",
        "../shared",
        "re-measured afterwards",
        "was not done",
        "not done",
    ],
)
def test_pages_describe_the_product_not_its_history(phrase):
    for page in PAGES:
        assert phrase not in page.read_text().lower(), f"{page.relative_to(ROOT)}: {phrase!r}"


ABSOLUTE = re.compile(r"(?:^|[\s`'\"(=])(/(?:work|home|root|tmp|mnt|Users|private|var/folders)/[^\s`'\")]*)")


def test_pages_show_no_path_of_a_development_machine():
    """Paths in README and docs are the repository's own, relative: a reader's machine has
    no /work, /home/<someone> or /tmp folder of ours (the recorded command outputs included)."""
    recorded = sorted((ROOT / "results").rglob("*.txt")) + sorted((ROOT / "results").rglob("*.md"))
    for page in [*PAGES, *recorded]:
        found = ABSOLUTE.findall(page.read_text())
        assert not found, f"{page.relative_to(ROOT)}: {found[:3]}"


@pytest.mark.slow  # several seconds: starts a browser
def test_every_chart_image_draws_in_a_browser():
    """docs/img/*.svg as GitHub shows them, opened in a real headless Chromium: each parses as
    SVG (a title with an unescaped character would give an XML error page instead), has a
    drawn size and its text, and logs no error."""
    from browser import chromium, open_pages

    if chromium() is None:
        pytest.skip("no Chromium here (apt install chromium, or set $CHROMIUM)")
    images = sorted((ROOT / "docs" / "img").glob("*.svg"))
    assert len(images) >= 3  # ladder, codecs, budget at least
    seen = open_pages(
        images,
        "const r = document.documentElement; return {tag: r.tagName, "
        "width: r.getBBox ? r.getBBox().width : 0, texts: document.querySelectorAll('text').length};",
    )
    for image in images:
        result = seen[image]["result"]
        assert seen[image]["errors"] == [] and result["tag"] == "svg", (image.name, seen[image])
        assert result["width"] > 100 and result["texts"] >= 5, (image.name, result)


@pytest.mark.docs
def test_the_recorded_metrics_show_holds_the_committed_figures():
    """`dvc metrics show` as the README records it prints what a fresh clone prints: the
    committed metrics/summary.json, figure for figure (the recordings' check leaves numbers out)."""
    import json

    lines = (ROOT / "results" / "dvc" / "metrics_show.txt").read_text().splitlines()
    header, row = lines[1].split(), lines[2].split()
    shown = dict(zip(header, row))
    summary = json.loads((ROOT / "metrics" / "summary.json").read_text())
    assert shown.pop("Path") == "metrics/summary.json" and shown.pop("machine") == summary.pop("machine")
    assert shown == {f"{name}.{key}": f"{value}" for name, figures in summary.items() for key, value in figures.items()}
