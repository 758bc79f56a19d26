"""The HTML report: content, escaping, byte-identical renders, and how headless Chromium renders it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from html.parser import HTMLParser
from pathlib import Path

import pytest

from rung.report import htmlpage


def _eval(headline: tuple, passk: tuple, by_source: dict, **extra) -> dict:
    """One checkpoint's eval result on 200 prompts: accuracy, format rate, mean tokens, truncation rate;
    pass@k for k = 1, 2, 4, 8; accuracy by source."""
    numbers = dict(zip(("accuracy", "format_rate", "mean_tokens", "truncation_rate"), headline, strict=True))
    pass_at_k = dict(zip(("1", "2", "4", "8"), passk, strict=True))
    return numbers | dict(n=200, pass_at_k=pass_at_k, accuracy_by_source=by_source) | extra


# fmt: off
EVALS = {
    "base": _eval((0.12, 0.4, 61.25, 0.3), (0.12, 0.19, 0.27, 0.35),
                  {"basic_arithmetic": 0.1, "chain_sum": 0.14, "leg_counting": 0.05}, accuracy_lenient=0.2,
                  accuracy_ci=[0.08, 0.165], sampling={"temperature": 0.0, "max_new_tokens": 96}),
    "sft": _eval((0.31, 0.97, 40.2, 0.02), (0.31, 0.42, 0.51, 0.6),
                 {"basic_arithmetic": 0.35, "chain_sum": 0.27, "leg_counting": 0.31}, accuracy_ci=[0.25, 0.375]),
    # a name with markup in it: must come out as text, never as an element; no leg_counting
    "rl/<b>main</b>": _eval((0.42, 0.99, 38.0, 0.01), (0.42, 0.5, 0.58, 0.64),
                            {"basic_arithmetic": 0.5, "chain_sum": 0.4}),
}
# fmt: on
CURVES = {"main": [(i, 0.2 + 0.5 * (1 - 0.93**i)) for i in range(0, 60, 2)], "long": [(0, 0.6), (10, 0.65), (20, 0.7)]}
SETTINGS = {"model": "SmolLM2-135M-Instruct", "seed": "0", "note": "a & b"}
TITLE = "rung <results>"
CAPTIONS = ["Held-out results per checkpoint", "Held-out accuracy per task source", "Settings"]
PLOTS = ["plot-pass-at-k", "plot-by-source", "plot-reward"]


@pytest.fixture(scope="module")
def page() -> str:
    return htmlpage.render(EVALS, CURVES, title=TITLE, settings=SETTINGS)


def test_tables_and_numbers(page):
    for table_id in ("headline", "by-source", "settings"):
        assert page.count(f'<table id="{table_id}">') == 1
    assert "<caption>Held-out results per checkpoint (accuracy with its Clopper-Pearson confidence" in page
    # accuracy 0.12 with CI [0.08, 0.165] -> 12.0% [8.0, 16.5]; the CI is only where given
    assert '<td class="num">12.0% <span class="ci">[8.0, 16.5]</span></td>' in page
    assert '<td class="num">42.0%</td>' in page
    assert '<td class="num">61.2</td>' in page  # mean tokens, one decimal (61.25 rounds half to even)
    assert '<td class="num">30.0%</td>' in page  # truncation rate
    assert "<th>accuracy (any format)</th>" in page  # only base has it: a column all the same ...
    assert page.count('<td class="num">—</td>') == 3  # ... with a dash for sft and rl, and the missing source
    assert "<td>max_new_tokens=96, temperature=0.0</td>" in page
    assert (
        '<tr><td>chain_sum</td><td class="num">14.0%</td><td class="num">27.0%</td><td class="num">40.0%</td></tr>'
        in page
    )
    for plot_id in PLOTS:
        assert page.count(f'<figure id="{plot_id}" class="plot">') == 1
    assert page.count("<figcaption>") == 3 and page.count("<svg") == 3


def test_text_is_escaped(page):
    assert "<b>" not in page
    assert "rl/&lt;b&gt;main&lt;/b&gt;" in page
    assert "<title>rung &lt;results&gt;</title>" in page and "<h1>rung &lt;results&gt;</h1>" in page
    assert "<td>a &amp; b</td>" in page


def test_ids_are_unique(page):
    ids = Counter(re.findall(r'\bid="([^"]+)"', page))
    assert ids and max(ids.values()) == 1, [i for i, n in ids.items() if n > 1]
    # and every reference inside the SVGs points at one of them
    assert set(re.findall(r'(?:url\(#|href="#)([^")]+)', page)) <= set(ids)


def test_plot_text_is_literal():
    evals = {"a$b$": {**EVALS["sft"]}}  # two dollars would be mathtext to matplotlib
    assert ">a$b$</text>" in htmlpage.render(evals)


def test_optional_parts_are_left_out():
    minimal = {"base": {"accuracy": 0.5, "format_rate": 1.0, "mean_tokens": 3.0, "truncation_rate": 0.0, "n": 2}}
    page = htmlpage.render(minimal, {})
    assert page.count("<table") == 1 and '<table id="headline">' in page
    assert "<figure" not in page and 'id="plots"' not in page
    assert "sampling" not in page and "any format" not in page and "confidence" not in page


def test_render_is_byte_identical(page, tmp_path):
    assert htmlpage.render(EVALS, CURVES, title=TITLE, settings=SETTINGS) == page
    assert "dc:date" not in page  # matplotlib's SVG date metadata is switched off
    # a fresh interpreter too: SVG ids come from the fixed hash salt, not from per-process state
    out = tmp_path / "sub" / "report.html"
    code = (
        "import sys; from rung.report import htmlpage; "
        "from tests.test_html_report import EVALS, CURVES, TITLE, SETTINGS; "
        "htmlpage.write(sys.argv[1], htmlpage.render(EVALS, CURVES, title=TITLE, settings=SETTINGS))"
    )
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, cwd=Path(__file__).resolve().parents[1])
    assert out.read_bytes() == page.encode("utf-8")


class _Dom(HTMLParser):
    """What the assertions need from a DOM dump: tables, SVGs per plot figure, caption texts.

    The standard library's parser, because no HTML library is a dependency of the project.
    """

    def __init__(self) -> None:
        super().__init__()
        self.tags: Counter[str] = Counter()
        self.table_ids: list[str] = []
        self.svgs: Counter[str] = Counter()  # plot figure id -> <svg> elements in it
        self.figure_text: dict[str, str] = defaultdict(str)
        self.captions: list[str] = []
        self._figure: str | None = None  # id of the plot figure being read
        self._caption: str | None = None  # text of the caption or figcaption being read

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags[tag] += 1
        if tag == "table":
            self.table_ids.append(a.get("id") or "")
        elif tag == "figure" and "plot" in (a.get("class") or "").split():
            self._figure = a.get("id") or ""
        elif tag == "svg" and self._figure is not None:
            self.svgs[self._figure] += 1
        elif tag in ("caption", "figcaption"):
            self._caption = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._figure = None
        elif tag in ("caption", "figcaption") and self._caption is not None:
            self.captions.append(self._caption.strip())
            self._caption = None

    def handle_data(self, data: str) -> None:
        if self._caption is not None:
            self._caption += data
        if self._figure is not None:
            self.figure_text[self._figure] += data


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp / 'profile'}",
        "--hide-scrollbars",
    ]
    # its config and cache go to the temporary directory too, not to $HOME
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp / "config"), "XDG_CACHE_HOME": str(tmp / "cache")}
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120, check=True, env=env)


@pytest.fixture(scope="module")
def browser_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not Path(CHROMIUM).exists():
        pytest.skip("headless Chromium not installed (Debian package `chromium`: apt-get install -y chromium)")
    return htmlpage.write(
        tmp_path_factory.mktemp("html") / "report.html", htmlpage.render(EVALS, CURVES, title=TITLE, settings=SETTINGS)
    )


def test_chromium_dom(browser_file, tmp_path):
    dom = _Dom()
    dom.feed(chromium(tmp_path, "--dump-dom", browser_file.as_uri()).stdout)
    assert dom.table_ids == ["headline", "by-source", "settings"]
    assert dict(dom.svgs) == {plot_id: 1 for plot_id in PLOTS}
    assert "b" not in dom.tags  # the checkpoint name stayed text
    assert [c.split(" (")[0] for c in dom.captions[:3]] == CAPTIONS
    assert len(dom.captions) == 6 and dom.captions[3].startswith("pass@k per checkpoint")
    # the plots keep their text as text: axis labels and the escaped legend entry
    assert "pass@k (%)" in dom.figure_text["plot-pass-at-k"]
    assert "rl/<b>main</b>" in dom.figure_text["plot-by-source"]
    assert "mean reward" in dom.figure_text["plot-reward"]


def test_chromium_screenshot(browser_file, tmp_path):
    from PIL import Image  # Pillow comes with matplotlib

    png = tmp_path / "report.png"
    chromium(tmp_path, f"--screenshot={png}", "--window-size=1200,1600", browser_file.as_uri())
    assert png.stat().st_size > 10_000
    with Image.open(png) as im:
        assert im.size == (1200, 1600)
        gray = im.convert("L")
        dark = sum(n for level, n in enumerate(gray.histogram()) if level < 200)
    assert dark / (1200 * 1600) > 0.01  # text, lines and bars, not a blank page
