"""A note written with the store's values: OUT/notes/NOTE.md and a self-contained NOTE.html.

Each bound number is the store's value now, in the form the note wrote it, with a footnote
that names what it read: its sweep (a link to the sweep's folder in the store), its rows (how
many, and their digest) and its code (the code digest, and the command that shows it). A table
block becomes the experiment's declared table; a figure block a PNG (beside NOTE.md; in
NOTE.html, inlined). NOTE.html is the Markdown made HTML with the report page's style: raw
HTML in a note is text (a tag shows as written), its links kept but for scripts, its images
only those it carries (data:image/png): it fetches nothing and runs nothing; a stale value is
struck through, as GitHub shows NOTE.md's ~~value~~.
"""

import base64
import os
import warnings
from pathlib import Path

import jinja2
import markdown as markdown_text
from markdown.inlinepatterns import SimpleTagInlineProcessor
from markupsafe import Markup

from harness import files, store
from harness.results.tables import markdown
from octlm_analysis import page, plots
from octlm_analysis.note_values import Value, shown

FIGURE_KEY = "harness-figure-"  # the PNGs' names: NOTE.harness-figure-N.png


def render(text: str, values: list[Value], out: Path, name: str, results: Path) -> list[Path]:
    """NOTE.md and NOTE.html in `out` (and the figures' PNGs beside them); their paths."""
    out.mkdir(parents=True, exist_ok=True)
    files.no_links_below(out)
    for old in out.glob(f"{name}.{FIGURE_KEY}*.png"):  # a figure of the note as it was
        old.unlink()
    parts, notes, figures, at = [], [], {}, 0
    for number, found in enumerate(sorted(values, key=lambda v: v.binding.start), 1):
        binding = found.binding
        parts.append(text[at : binding.start])
        at = binding.end
        notes.append(f"[^h{number}]: {_provenance(found, out, results)}")
        if found.problem:
            was = binding.written or "no value"
            parts.append(f"~~{was}~~ (stale: {found.problem})[^h{number}]")
        elif binding.block == "harness-table":
            caption = found.table.attrs.get("caption", "")
            parts.append(f"{markdown(found.table)}\n\n{caption}[^h{number}]\n")
        elif binding.block == "harness-figure":
            png = _figure(found, out / f"{name}.{FIGURE_KEY}{number}.png")
            figures[png.name] = png
            parts.append(f"![{binding.metric}]({png.name})[^h{number}]\n")
        else:
            parts.append(f"{_linked(found, out, results)}[^h{number}]")
    parts.append(text[at:])
    body = "".join(parts).rstrip("\n") + "\n\n" + "\n".join(notes) + "\n"
    note = out / f"{name}.md"
    files.write_text(note, body)
    inlined = body
    for file, path in figures.items():
        data = base64.b64encode(path.read_bytes()).decode()
        inlined = inlined.replace(f"]({file})", f"](data:image/png;base64,{data})")
    document = out / f"{name}.html"
    files.write_text(document, _html(inlined, name))
    return [note, document, *figures.values()]


def _provenance(found: Value, out: Path, results: Path) -> str:
    """What a value read, for its footnote: `exp tiled_err64 max`, sweep (linked), rows and
    their digest, code."""
    binding = found.binding
    said = f"`{binding.source()}`"
    if found.sweep is None:
        return f"{said}: {found.problem}"
    folder = store.SweepPaths(results, binding.experiment, found.sweep).folder
    link = Path(os.path.relpath(folder, out)).as_posix()
    said += f" from sweep [`{found.sweep}`]({link})"
    if found.problem:
        return f"{said}: {found.problem}"
    counted = "claims" if binding.reducer == "verdict" else "rows"
    said += f"; {found.rows} {counted}, sha256 `{found.digest[:16]}`"
    codes = ", ".join(f"`{c[:16]}`" for c in found.code) or "none recorded"
    return f"{said}; code {codes} (`python -m harness code {found.sweep}`)"


def _linked(found: Value, out: Path, results: Path) -> str:
    """A value linked to its sweep's folder, what it read as the link's title: "[4e-07](
    ../results/experiment=.../sweep=ID "9 rows sha256 ...; code ...")"."""
    folder = store.SweepPaths(results, found.binding.experiment, found.sweep).folder
    link = Path(os.path.relpath(folder, out)).as_posix()
    counted = "claims" if found.binding.reducer == "verdict" else "rows"
    code = ", ".join(c[:16] for c in found.code) or "none recorded"
    title = f"{found.rows} {counted}, sha256 {found.digest[:16]}; code {code}"
    return f'[{shown(found)}]({link} "{title}")'


def _figure(found: Value, path: Path) -> Path:
    """The figure block's metric against the sweep's parameter with the most values, a line
    per other parameter that varies, as a PNG."""
    from octlm_analysis.png_figures import png

    rows, metric = found.table, found.binding.metric.rpartition(".")[2]
    params = [p for p in found.params if p != metric and p in rows]
    x = plots.axis(rows, {}, params) or ("job" if "job" in rows else None)
    title = f"{found.binding.experiment}: {metric}"
    figure = plots.lines(rows, x, metric, [p for p in params if p != x], title) if x else None
    with warnings.catch_warnings():  # matplotlib's on a layout it cannot tighten
        warnings.simplefilter("ignore", UserWarning)
        drawn = png([figure], path) if figure is not None else None
    if drawn is None:
        raise ValueError(f"nothing to draw of {metric}")
    return path


def _html(body: str, name: str) -> str:
    """The rendered note as one HTML page: its Markdown, raw HTML read as text, with the page's
    style."""
    converted = markdown_text.markdown(
        body, extensions=["tables", "footnotes", "fenced_code", _Carried()]
    )
    converted = converted.replace("<table>", '<table class="data">')
    templates = jinja2.Environment(loader=jinja2.FileSystemLoader(page.TEMPLATES),
                                   autoescape=True, undefined=jinja2.StrictUndefined)  # fmt: skip
    style = Markup((page.TEMPLATES / "page.css").read_text())  # the report page's, as it is
    return templates.get_template("note.html").render(title=name, style=style,
                                                      body=Markup(converted))  # fmt: skip


class _Carried(markdown_text.extensions.Extension):
    """A note's HTML tags as text (Markdown's readers of raw HTML taken out: the writer escapes
    what they leave), ~~struck~~ text struck (a stale value's), links but for scripts, images
    only those the page carries (data:image/png)."""

    def extendMarkdown(self, md) -> None:  # noqa: N802 (Markdown's name)
        md.preprocessors.deregister("html_block")
        md.inlinePatterns.deregister("html")
        struck = SimpleTagInlineProcessor(r"(~~)(.+?)~~", "del")
        md.inlinePatterns.register(struck, "struck", 45)
        md.treeprocessors.register(_Kept(md), "carried", 0)


class _Kept(markdown_text.treeprocessors.Treeprocessor):
    def run(self, root) -> None:
        for element in root.iter():
            target = (element.get("href") or element.get("src") or "").strip().lower()
            if element.tag == "a" and target.startswith(("javascript:", "data:", "vbscript:")):
                element.tag, element.attrib = "span", {}
            elif element.tag == "img" and not target.startswith("data:image/png;base64,"):
                element.tag, element.text, element.attrib = "span", element.get("alt", ""), {}
