"""A self-contained HTML report of every evaluated checkpoint: tables and inline SVG plots.

The page reads offline: no external CSS, JavaScript or fonts, and the plots are matplotlib SVG
inlined in the document, with their text kept as SVG text (the viewer's sans-serif font) so it
stays small, searchable and selectable. The same inputs give the same bytes.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator
from matplotlib.typing import RcKeyType

from rung.files import atomic_path

# Applied while plots are built and saved. A fixed hash salt makes matplotlib's SVG ids the same
# on every render (they are random otherwise); fonttype "none" writes text as <text>, not paths.
_RC: dict[RcKeyType, object] = {
    "svg.hashsalt": "rung",
    "svg.fonttype": "none",
    "font.size": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
}
_FIGSIZE = (7.2, 3.8)
_MISSING = "—"

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: #222; margin: 0; background: #fff; }
main { max-width: 980px; margin: 0 auto; padding: 1.5rem; }
h1 { font-size: 1.6rem; margin: 0 0 1rem; }
h2 { font-size: 1.2rem; margin: 2rem 0 0.5rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.92rem; }
caption { caption-side: top; text-align: left; font-weight: 600; padding-bottom: 0.4rem; }
th, td { padding: 0.3rem 0.7rem; border-bottom: 1px solid #e4e4e4; text-align: left; }
thead th { border-bottom: 2px solid #bbb; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.ci { color: #666; font-size: 0.85em; }
figure.plot { margin: 0.5rem 0 2rem; }
figure.plot svg { width: 100%; max-width: 760px; height: auto; display: block; }
figcaption { color: #444; font-size: 0.9rem; margin-top: 0.3rem; }
p.note { color: #444; font-size: 0.9rem; max-width: 52rem; margin: -1rem 0 1.5rem; }
"""


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


# Headline columns: (metrics key, header, cell format, always shown). A column that is not always
# shown appears only when some checkpoint has that key.
_HEADLINE: list[tuple[str, str, Callable[[Any], str], bool]] = [
    ("accuracy", "accuracy", _pct, True),
    ("accuracy_lenient", "accuracy (any format)", _pct, False),
    ("format_rate", "format rate", _pct, True),
    ("mean_tokens", "mean tokens", lambda v: f"{v:.1f}", True),
    ("truncation_rate", "truncated", _pct, True),
    ("n", "prompts", str, True),
]


class Extra(NamedTuple):
    """A table given as text, shown after the headline table: cells that start with a digit, a
    sign or '< digit' are right-aligned numbers; notes are paragraphs under it."""

    table_id: str
    caption: str
    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    notes: Sequence[str]


_NUMERIC = re.compile(r"^([0-9+\-−]|< ?[0-9])")


def extra_table(t: Extra) -> str:
    """An Extra table (and its notes) as HTML."""
    body = [[(_e(c), bool(_NUMERIC.match(c))) for c in row] for row in t.rows]
    return "\n".join(
        [_table(t.table_id, t.caption, t.header, body), *(f'<p class="note">{_e(n)}</p>' for n in t.notes)]
    )


def _e(value: Any) -> str:
    return html.escape(str(value))


def _mpl_text(s: str) -> str:
    """A name as literal plot text: matplotlib reads text between two `$` as mathtext."""
    return s.replace("$", r"\$")


def _table(table_id: str, caption: str, header: Sequence[str], body: Sequence[Sequence[tuple[str, bool]]]) -> str:
    """An HTML table; body cells are (html, is_number), the html already escaped."""
    # Written out rather than pandas' DataFrame.to_html: cells carry markup (the CI span) and classes.
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    rows = [
        "<tr>" + "".join(f'<td class="num">{c}</td>' if num else f"<td>{c}</td>" for c, num in row) + "</tr>"
        for row in body
    ]
    return "\n".join(
        [
            f'<table id="{table_id}">',
            f"<caption>{_e(caption)}</caption>",
            f"<thead><tr>{head}</tr></thead>",
            "<tbody>",
            *rows,
            "</tbody>",
            "</table>",
        ]
    )


def _headline(evals: Mapping[str, Mapping[str, Any]]) -> str:
    columns = [c for c in _HEADLINE if c[3] or any(c[0] in m for m in evals.values())]
    with_sampling = any(m.get("sampling") for m in evals.values())
    body = []
    for name, m in evals.items():
        row = [(_e(name), False)]
        for key, _, fmt, _ in columns:
            cell = _e(fmt(m[key])) if key in m else _MISSING
            if key == "accuracy" and m.get("accuracy_ci"):
                lo, hi = m["accuracy_ci"]
                cell += f' <span class="ci">[{100 * lo:.1f}, {100 * hi:.1f}]</span>'
            row.append((cell, True))
        if with_sampling:
            row.append((_e(", ".join(f"{k}={v}" for k, v in sorted(m.get("sampling", {}).items()))), False))
        body.append(row)
    header = ["checkpoint", *(title for _, title, _, _ in columns), *(["sampling"] if with_sampling else [])]
    caption = "Held-out results per checkpoint"
    if any(m.get("accuracy_ci") for m in evals.values()):
        caption += " (accuracy with its Clopper-Pearson confidence interval, in points)"
    return _table("headline", caption, header, body)


def _sources(evals: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return sorted({s for m in evals.values() for s in m.get("accuracy_by_source", {})})


def _by_source(evals: Mapping[str, Mapping[str, Any]]) -> str:
    body = [
        [(_e(s), False)]
        + [
            (_pct(m["accuracy_by_source"][s]) if s in m.get("accuracy_by_source", {}) else _MISSING, True)
            for m in evals.values()
        ]
        for s in _sources(evals)
    ]
    return _table("by-source", "Held-out accuracy per task source", ["source", *evals], body)


def settings_table(settings: Mapping[str, Any]) -> str:
    body = [[(_e(k), False), (_e(v), False)] for k, v in settings.items()]
    return _table("settings", "Settings", ["setting", "value"], body)


def pass_at_k_plot(evals: Mapping[str, Mapping[str, Any]], colors: Mapping[str, str] | None = None) -> Figure | None:
    """pass@k against k (log2 axis), one line per name of `evals` (metrics with pass_at_k, and
    optionally pass_at_k_band {k: [low, high]}, drawn as a shaded band at the band's k)."""
    curves = {}
    for name, m in evals.items():
        band = m.get("pass_at_k_band") or {}
        ks = sorted(int(k) for k in (band or m.get("pass_at_k") or {}))
        if ks:
            curves[name] = [(k, m["pass_at_k"][str(k)], *band.get(str(k), ())) for k in ks]
    if not curves:
        return None
    fig = Figure(figsize=_FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    for i, (name, points) in enumerate(curves.items()):
        color = (colors or {}).get(name, f"C{i % 10}")
        ks, values = [p[0] for p in points], [100 * p[1] for p in points]
        ax.plot(ks, values, marker="o", markersize=4, color=color, label=_mpl_text(name))
        if all(len(p) == 4 for p in points):
            ax.fill_between(ks, [100 * p[2] for p in points], [100 * p[3] for p in points], color=color, alpha=0.15)
    ks = sorted({p[0] for points in curves.values() for p in points})
    ax.set_xscale("log", base=2)  # k is usually 1, 2, 4, ...: evenly spaced on a log2 axis
    ax.set_xticks(ks, labels=[str(k) for k in ks] if len(ks) <= 16 else None)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_ylim(bottom=0)
    ax.set(xlabel="k (samples per prompt)", ylabel="pass@k (%)")
    ax.legend()
    return fig


def _by_source_plot(evals: Mapping[str, Mapping[str, Any]], colors: Mapping[str, str]) -> Figure | None:
    sources = _sources(evals)
    names = [name for name, m in evals.items() if m.get("accuracy_by_source")]
    if not names:
        return None
    fig = Figure(figsize=_FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(sources))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        by = evals[name]["accuracy_by_source"]
        heights = [100 * by[s] if s in by else np.nan for s in sources]  # no bar where a source is missing
        ax.bar(x + (i - (len(names) - 1) / 2) * width, heights, width, color=colors[name], label=_mpl_text(name))
    ax.set_xticks(
        x,
        labels=[_mpl_text(s) for s in sources],
        rotation=25 if len(sources) > 3 else 0,
        ha="right" if len(sources) > 3 else "center",
    )
    ax.grid(axis="x", visible=False)
    ax.set_ylim(bottom=0)
    ax.set(ylabel="accuracy (%)")
    ax.legend()
    return fig


def _svg(fig: Figure, prefix: str) -> str:
    """The figure as an SVG element to inline in HTML (call inside the rc context)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})  # no date: same bytes on every render
    text = buf.getvalue()
    text = text[text.index("<svg") :]  # the XML declaration and DOCTYPE have no place inside HTML
    # All inline SVGs share the page's id namespace and matplotlib numbers ids afresh in each
    # (figure_1, axes_1, ...): prefix every id and every reference to one.
    return re.sub(r'(id="|url\(#|href="#)', rf"\1{prefix}-", text)


def _figure(fig_id: str, svg: str, caption: str) -> str:
    return f'<figure id="{fig_id}" class="plot">\n{svg}<figcaption>{_e(caption)}</figcaption>\n</figure>'


Plot = tuple[str, Callable[[], Figure | None], str]
"""(figure id, a function drawing the figure or returning None when there is nothing to draw, caption)."""


def figures(plots: Sequence[Plot]) -> list[str]:
    """The plots drawn and inlined as SVG figures, under the report's matplotlib settings."""
    with matplotlib.rc_context(_RC):
        drawn = [(fig_id, draw(), caption) for fig_id, draw, caption in plots]
        return [_figure(fig_id, _svg(fig, fig_id), caption) for fig_id, fig, caption in drawn if fig is not None]


def save_figures(plots: Sequence[Plot], folder: Path) -> list[Path]:
    """The plots drawn as standalone SVG files `folder/<id>.svg` (for a README or a paper)."""
    saved = []
    with matplotlib.rc_context(_RC):
        for fig_id, draw, _ in plots:
            fig = draw()
            if fig is not None:
                with atomic_path(folder / f"{fig_id}.svg") as tmp:
                    fig.savefig(tmp, format="svg", metadata={"Date": None})
                saved.append(folder / f"{fig_id}.svg")
    return saved


def band_plot(curves: Mapping[str, Sequence[tuple[float, ...]]], xlabel: str, ylabel: str) -> Figure | None:
    """One line per name through (x, y) points, or (x, mean, low, high) points with a shaded band from
    low to high (e.g. the range over seeds); None when there are no points."""
    curves = {name: sorted(points) for name, points in curves.items() if points}
    if not curves:
        return None
    fig = Figure(figsize=_FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    for i, (name, points) in enumerate(curves.items()):
        x, mid, *band = zip(*points, strict=True)
        ax.plot(
            x, mid, marker="o" if len(points) <= 40 else None, markersize=4, color=f"C{i % 10}", label=_mpl_text(name)
        )
        if band:
            low, high = band
            ax.fill_between(x, low, high, color=f"C{i % 10}", alpha=0.2, linewidth=0)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.legend()
    return fig


def page(title: str, tables: Sequence[str], figures_html: Sequence[str] = (), warnings: Sequence[str] = ()) -> str:
    """A self-contained HTML document: warnings, then tables (HTML, e.g. from `extra_table`), then figures."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        "<main>",
        f"<h1>{_e(title)}</h1>",
        *(
            [
                '<section id="warnings">',
                "<h2>Warnings</h2>",
                "<ul>",
                *(f"<li>{_e(w)}</li>" for w in warnings),
                "</ul>",
                "</section>",
            ]
            if warnings
            else []
        ),
        '<section id="tables">',
        *tables,
        "</section>",
    ]
    if figures_html:
        parts += ['<section id="plots">', "<h2>Plots</h2>", *figures_html, "</section>"]
    parts += ["</main>", "</body>", "</html>", ""]
    return "\n".join(parts)


def render(
    evals: Mapping[str, Mapping[str, Any]],
    reward_curves: Mapping[str, Sequence[tuple[int, float]]] | None = None,
    *,
    title: str = "rung results",
    settings: Mapping[str, Any] | None = None,
    extra: Sequence[Extra] = (),
    warnings: Sequence[str] = (),
    sections: Sequence[str] = (),
    plots: Sequence[Plot] = (),
) -> str:
    """The whole HTML document.

    evals maps checkpoint name to its metrics (keys accuracy, format_rate, mean_tokens,
    truncation_rate, n; optionally accuracy_lenient, accuracy_ci [lo, hi], pass_at_k {"k": v},
    accuracy_by_source {source: v}, sampling {name: value}), in the order the rows should have;
    reward_curves maps RL stage name to (step, mean reward) points; settings is shown as a table;
    extra tables (e.g. the paired comparisons) follow the headline table; warnings (rung.report.health)
    are listed above everything else; sections (HTML, e.g. `episodes_section`) follow the extra tables; plots
    follow the reward curves.
    """
    colors = {name: f"C{i % 10}" for i, name in enumerate(evals)}  # one colour per checkpoint in every plot
    figures_html = figures(
        [
            (
                "plot-pass-at-k",
                lambda: pass_at_k_plot(evals, colors),
                "pass@k per checkpoint: the chance that at least one of k samples is correct "
                "(unbiased estimator of Chen et al. 2021); the band, where drawn, is the "
                "interval over prompts at each power of two (Clopper-Pearson at the effective number of prompts).",
            ),
            (
                "plot-by-source",
                lambda: _by_source_plot(evals, colors),
                "Held-out accuracy per task source and checkpoint.",
            ),
            (
                "plot-reward",
                lambda: band_plot(reward_curves or {}, "training step", "mean reward"),
                "Mean reward per logged training step of each RL stage: of the groups trained on, "
                "and, with dynamic sampling, "
                "of all generated groups (zero-variance groups included).",
            ),
            *plots,
        ]
    )
    tables = [_headline(evals), *(extra_table(t) for t in extra), *sections]
    if _sources(evals):
        tables.append(_by_source(evals))
    if settings:
        tables.append(settings_table(settings))
    return page(title, tables, figures_html, warnings)


def episodes_section(episodes: Sequence[tuple[str, Sequence[tuple[str, str]]]], note: str) -> str:
    """Whole episodes, each a (title, [(role, text)]) pair: one block per message, every text escaped (a model's
    output and a tool's are untrusted)."""
    parts = ['<section id="episodes">', "<h2>Episodes</h2>", f'<p class="note">{_e(note)}</p>']
    for title, messages in episodes:
        parts += [f"<h3>{_e(title)}</h3>", "<dl>"]
        parts += [f"<dt>{_e(role)}</dt><dd><pre>{_e(text)}</pre></dd>" for role, text in messages]
        parts.append("</dl>")
    return "\n".join([*parts, "</section>"])


def write(path: str | Path, html: str) -> Path:
    """Write a rendered page (`render`'s document) to path (parent directories created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return path
