"""The page's figures (octlm_analysis.plots: plain dicts of traces and layout) drawn with
matplotlib, for REPORT.md, where the page's interactive plots cannot go: a claim's bound (a
dashed trace) as a dashed line, a log axis log, traces without a legend entry left out. Their
texts are plotly's (octlm_analysis.plots.plain: entities for what plotly reads as markup): each
shown as the user wrote it, a dollar sign as itself rather than matplotlib's mathtext.
"""

import base64
import html
import textwrap
from pathlib import Path

import numpy as np


def png(figures: list[dict], path: Path) -> Path | None:
    """Figures (as octlm_analysis.plots makes them) drawn into one PNG at `path`, a panel
    each; None without figures."""
    if not figures:
        return None
    from matplotlib.figure import Figure  # drawn to a file: no pyplot, no backend to choose

    panels = Figure(figsize=(6 * len(figures), 4.2))
    axes = panels.subplots(1, len(figures), squeeze=False)
    for axis, fig in zip(axes[0], figures, strict=True):
        layout = fig["layout"]
        for trace in fig["data"]:
            if trace.get("showlegend") is False:
                continue
            xs, ys, label = _values(trace["x"]), _values(trace["y"]), _text(trace["name"])
            if not isinstance(xs, np.ndarray):
                xs = [_text(x) if isinstance(x, str) else x for x in xs]
            if trace.get("line", {}).get("dash") == "dash":  # a claim's bound
                if len(set(np.asarray(ys).tolist())) == 1:
                    axis.axhline(ys[0], linestyle="--", label=label, linewidth=1,
                                 color=trace["line"].get("color"))  # fmt: skip
                else:
                    axis.plot(xs, ys, "--", label=label, linewidth=1)
                continue
            marker = "o" if "markers" in trace.get("mode", "") else None
            axis.plot(xs, ys, marker=marker, label=label, linewidth=1)
        for name, scale in (("x", axis.set_xscale), ("y", axis.set_yscale)):
            if layout[f"{name}axis"]["type"] == "log":
                scale("log")
        if "tickvals" in layout["xaxis"]:
            axis.set_xticks(layout["xaxis"]["tickvals"], layout["xaxis"]["ticktext"])
            axis.minorticks_off()
        axis.set(xlabel=_text(layout["xaxis"]["title"]["text"]),
                 ylabel=_text(layout["yaxis"]["title"]["text"]))  # fmt: skip
        title = _text(layout["title"]["text"].replace("<br>", " "))
        axis.set_title(textwrap.fill(title, 60), fontsize="small")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize="x-small")
    panels.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    panels.savefig(path, dpi=100)
    return path


def _values(values) -> np.ndarray | list:
    """A trace's array, a typed one (plots.typed) decoded."""
    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=np.dtype(values["dtype"]))
    return values


def _text(text: str) -> str:
    """A plotly text as the user wrote it, for matplotlib: entities decoded, a $ not mathtext."""
    return html.unescape(str(text)).replace("$", r"\$")
