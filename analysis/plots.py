"""The report page's plots, as Plotly figures: plain dicts of traces and layout, which plotly.js
draws as they are (plotly.graph_objects.Figure(figure) validates one; the tests do).

Every figure has a title and axis titles with units, a trace per series named by the settings
that tell its points apart (never an empty one), hover text with each point's parameters and
value, error bars from a timing's stored spread, and a log axis where its values span more than
a decade. Every user's text (a name, a value, a claim) goes in as `plain` text, and never into a
hover template's own text: a trace's text or meta holds it, the template refers to it (plotly.js
never reads a value put in for a placeholder as a template again). Training curves are downsampled
for the browser without losing their extremes (`downsample`: at most CURVE_POINTS points a curve,
each bucket's minimum and maximum).
REPORT.md's still pictures of the same figures are octlm_analysis.png_figures'.
"""

import base64
import html
import math
import textwrap

import numpy as np
import pandas as pd

from harness import store
from harness.measuring.columns import is_housekeeping, is_number_column
from harness.names import setting
from harness.results import expressions

CURVE_POINTS = 2000  # at most this many points a training curve (2 per bucket: min and max)
FIGURE_POINTS = 60_000  # and at most about this many a figure of curves, but 400 a curve
MARKERS = 200  # a line of more points than this is drawn without markers (hover still works)
DECADES = 1.0  # values that span more than this many decades get a log axis
TITLE_CHARS = 50  # a plot's title is wrapped to lines of at most this many characters
TOOLBAR_PX = 38  # the strip at a plot's top where plotly.js draws its tool bar
GRID_TICKS = 16  # a log axis over at most this many powers of two is ticked at each
UNITS = {"tokens_per_s": "tokens/s", "_ms": "ms", "_s": "s", "_mib": "MiB"}  # first match


def plain(text) -> str:
    """A user's text as plotly.js shows it, character for character: & < > as entities (it reads
    a subset of HTML in every text it draws: <b>, <br>, &amp;) and % too (it reads %{...} in a
    title or a trace's name as a placeholder); plotly.js decodes the entities for display."""
    return html.escape(str(text), quote=False).replace("%", "&#37;")


def _plain_values(values: list) -> list:
    """An axis's values, its texts (categories, drawn as tick labels) plain."""
    return [plain(v) if isinstance(v, str) else v for v in values]


def title(column: str) -> str:
    """An axis title: the column and its unit, e.g. "time_ms (ms)", "memory_mib (MiB)"."""
    unit = next((unit for suffix, unit in UNITS.items() if column.endswith(suffix)), None)
    return f"{column} ({unit})" if unit else column


def figure(traces: list[dict], name: str, x: str, y: str, xs=(), ys=()) -> dict:
    """A figure of `traces`, titled (wrapped to TITLE_CHARS a line, below the tool bar's strip
    at the top), its axes titled and log where their values span decades, a log axis over a
    grid of powers of two ticked at the grid's values."""
    lines = textwrap.wrap(name, TITLE_CHARS) or [name]
    title = {
        "text": "<br>".join(map(plain, lines)),
        "x": 0.01,
        "xanchor": "left",
        "yref": "container",
        "y": 1,
        "yanchor": "top",
        "pad": {"t": TOOLBAR_PX + 12 * (len(lines) - 1)},
    }
    # (plotly.js anchors a title of several lines higher than its top: 12 px a line more)
    layout = {
        "title": title,
        "xaxis": {"title": {"text": plain(x)}, "type": axis_type(xs), **grid_ticks(xs)},
        "yaxis": {"title": {"text": plain(y)}, "type": axis_type(ys)},
        "hovermode": "closest",
        "legend": {"title": {"text": "click to hide or show"}},
        "margin": {"t": TOOLBAR_PX + 12 + 28 * len(lines), "r": 20},
    }
    return {"data": traces, "layout": layout}


def grid_ticks(values) -> dict:
    """Ticks at each value of a log axis over a grid of powers of two (128, 256, ..., 2048),
    which plotly.js would label 2 3 4 ... 1000 2; {} for any other axis."""
    if axis_type(values) != "log":
        return {}
    grid = sorted(set(pd.to_numeric(pd.Series(list(values)), errors="coerce").dropna()))
    powers = all(float(v).is_integer() and int(v) & (int(v) - 1) == 0 for v in grid)
    if not powers or len(grid) > GRID_TICKS:
        return {}
    return {"tickvals": grid, "ticktext": [f"{int(v):,}" for v in grid]}


def axis_type(values) -> str:
    """log for positive values that span more than DECADES decades, linear for other numbers,
    "-" (plotly.js's own choice: dates as dates, texts as categories) without any."""
    numbers = pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce").dropna()
    if not len(numbers):
        return "-"
    values = numbers[np.isfinite(numbers.astype(float))]
    if len(values) < 2 or (values <= 0).any():
        return "linear"
    return "log" if math.log10(values.max() / values.min()) > DECADES else "linear"


def label(point: pd.Series | dict, names: list[str]) -> str:
    """A point's settings as on the command line: attention=sdpa window=4."""
    return " ".join(setting(name, point[name]) for name in names) or "all points"


def varying(data: pd.DataFrame, columns: list[str]) -> list[str]:
    """The columns of `columns` that take more than one value in `data`, less those holding
    lists (a series cannot be keyed by one)."""
    return [
        c
        for c in columns
        if c in data
        and data[c].astype(str).nunique() > 1
        and not data[c].map(lambda v: isinstance(v, list | tuple | np.ndarray | dict)).any()
    ]


def lines(
    data: pd.DataFrame,
    x: str,
    y: str,
    series: list[str],
    name: str,
    hover: list[str] = (),
    spread: str | None = None,
) -> dict | None:
    """`y` against `x`, a line per value of the `series` columns that vary (the others are the
    same on every line, so they name none); a point's hover text has its `hover` parameters.
    `spread`: a column of the interquartile range's width, drawn as error bars of half of it
    either way. None when no point has a value."""
    data = data.dropna(subset=[y]) if y in data else data.iloc[:0]
    data = data[pd.to_numeric(data[y], errors="coerce").notna()]
    if data.empty:
        return None
    named = varying(data, series)
    traces = []
    for key, line in data.groupby(named, dropna=False, sort=False) if named else [((), data)]:
        line = line.sort_values(x)
        trace = {
            "type": "scatter",
            "mode": "lines+markers",
            "name": plain(label(dict(zip(named, _tuple(key), strict=True)), named)),
            "x": _plain_values(line[x].tolist()),
            "y": line[y].astype(float).tolist(),
            "text": [plain(label(point, list(hover))) for _, point in line.iterrows()],
            "meta": [plain(x), plain(y)],
            "hovertemplate": "%{text}<br>%{meta[0]}=%{x}<br>%{meta[1]}=%{y:.4g}"
            "<extra>%{fullData.name}</extra>",
        }
        if spread and spread in line and line[spread].notna().any():
            trace["error_y"] = _error_bars(line, y, spread)
        traces.append(trace)
    return figure(traces, name, x, title(y), data[x], data[y])


def _error_bars(line: pd.DataFrame, y: str, spread: str) -> dict:
    """A median's interquartile range as error bars: the repeats' own quartiles where the rows
    keep them (X_samples_ms beside X_iqr_ms: however lopsided), else half the range's width
    either way."""
    half = (line[spread] / 2).to_numpy(dtype=float)
    above, below = half.copy(), half.copy()
    samples = spread.replace("_iqr_ms", "_samples_ms")
    if samples in line:
        middle = line[y].to_numpy(dtype=float)
        for i, repeats in enumerate(line[samples]):
            if _listlike(repeats) and len(repeats):
                low, high = np.percentile(repeats, [25, 75])
                above[i], below[i] = high - middle[i], middle[i] - low
    return {"type": "data", "symmetric": False, "array": above.tolist(),
            "arrayminus": below.tolist(), "visible": True, "thickness": 1}  # fmt: skip


def _listlike(value) -> bool:
    return isinstance(value, list | tuple | np.ndarray)


def with_bounds(
    fig: dict, data: pd.DataFrame, x: str, bounds: dict[str, list], series: list[str] = ()
) -> dict:
    """A claim's bounds drawn on its figure: a number as a dashed line across; an expression
    (2 * sdpa_err64 + 1e-6) through its value at each point: one dashed line where it is the
    same for every line at each x, else a dashed line per line of the figure (the `series`
    that vary, as lines() draws them), each point's own bound beside its value."""
    xs = sorted(data[x].dropna().unique().tolist())
    named = varying(data, list(series))
    for side, listed in bounds.items():
        for bound in listed:
            if not isinstance(bound, str):
                _bound_trace(fig, f"{side} {bound}", xs, [float(bound)] * len(xs))
                continue
            values = pd.to_numeric(expressions.evaluate(bound, data), errors="coerce")
            drawn = data.assign(_bound=values.astype(float)).dropna(subset=[x, "_bound"])
            per_x = drawn.groupby(x)["_bound"]
            if not named or (per_x.nunique() <= 1).all():  # one line: the tightest at each x
                tightest = per_x.min() if side == "max" else per_x.max()
                _bound_trace(fig, f"{side} {bound}", tightest.index.tolist(), tightest.tolist())
                continue
            for key, line in drawn.groupby(named, dropna=False, sort=False):
                line = line.sort_values(x)
                which = label(dict(zip(named, _tuple(key), strict=True)), named)
                _bound_trace(fig, f"{side} {bound} ({which})", line[x].tolist(),
                             line["_bound"].tolist())  # fmt: skip
    every = [y for trace in fig["data"] for y in trace["y"]]
    fig["layout"]["yaxis"]["type"] = axis_type(every)
    return fig


def _bound_trace(fig: dict, name: str, xs: list, ys: list) -> None:
    fig["data"].append({"type": "scatter", "mode": "lines", "name": plain(name),
                        "x": _plain_values(xs), "y": ys,
                        "line": {"dash": "dash", "color": "#c0392b"},
                        "hovertemplate": "%{fullData.name}: %{y:.3g}<extra></extra>"})  # fmt: skip


def downsample(steps: np.ndarray, values: np.ndarray, points: int = CURVE_POINTS):
    """A curve of at most `points` points that keeps its extremes: the steps cut into
    points // 2 buckets of consecutive rows, each drawn as its minimum and its maximum at the
    steps where they occur (in step order). Curves that short already are returned whole.
    NaN values are dropped first."""
    keep = ~np.isnan(values)
    steps, values = steps[keep], values[keep]
    if len(values) <= points:
        return steps, values
    buckets = points // 2
    starts = np.linspace(0, len(values), buckets, endpoint=False).astype(np.int64)
    low, high = np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)
    sizes = np.diff(np.append(starts, len(values)))
    bucket = np.repeat(np.arange(buckets), sizes)
    at_low = _first(values == np.repeat(low, sizes), bucket, buckets)
    at_high = _first(values == np.repeat(high, sizes), bucket, buckets)
    chosen = np.unique(np.concatenate([at_low, at_high]))  # sorted: in step order
    return steps[chosen], values[chosen]


def typed(values, dtype: str = "f4") -> dict:
    """A long array as plotly.js's typed array: its little-endian bytes in base64 (float32:
    about 5 bytes a value, where JSON text takes up to 20), as plotly.py itself writes numpy
    arrays."""
    data = np.ascontiguousarray(values, dtype=np.dtype(dtype).newbyteorder("<"))
    return {"dtype": dtype, "bdata": base64.b64encode(data.tobytes()).decode("ascii")}


def steps_array(steps: np.ndarray) -> dict:
    """Steps as a typed array: int32 where they fit, else float64."""
    return typed(steps, "i4" if len(steps) and steps.max() < 2**31 else "f8")


def _first(hits: np.ndarray, bucket: np.ndarray, buckets: int) -> np.ndarray:
    """The index of each bucket's first hit (every bucket has one)."""
    where = np.flatnonzero(hits)
    return where[np.searchsorted(bucket[where], np.arange(buckets))]


def curves(
    train: pd.DataFrame, labels: dict, metric: str, held_out: pd.DataFrame | None = None
) -> dict | None:
    """A training metric against step, a line per job (`labels`: job -> its settings), each
    downsampled (`downsample`), hover giving the step and value; the held-out value of each
    job (`held_out`: job, step, metric) marked as a diamond at its step. None without values."""
    if metric not in train or train[metric].isna().all():
        return None
    traces, shown = [], []
    jobs = train.groupby("job", sort=True)
    budget = min(CURVE_POINTS, max(400, FIGURE_POINTS // max(jobs.ngroups, 1)))
    for job, rows in jobs:
        steps, values = downsample(rows["step"].to_numpy(), rows[metric].to_numpy(dtype=float),
                                   budget)  # fmt: skip
        if not len(values):
            continue
        name = labels.get(job, f"job {job}")
        traces.append({"type": "scatter", "mode": "lines", "name": plain(name), "legendgroup": name,
                       "x": steps_array(steps), "y": typed(values), "meta": [plain(name),
                       plain(metric)], "hovertemplate": "%{meta[0]}<br>step %{x}<br>%{meta[1]} "
                                                        "%{y:.4g}<extra></extra>"})  # fmt: skip
        shown.append(values)
    if held_out is not None and metric in held_out:
        marked = held_out.dropna(subset=[metric])
        for job, row in marked.set_index("job").iterrows():
            name = labels.get(job, f"job {job}")
            traces.append({"type": "scatter", "mode": "markers", "name": plain(f"{name}, held out"),
                           "legendgroup": name, "showlegend": False, "x": [row["step"]],
                           "y": [float(row[metric])], "meta": [plain(name), plain(metric)],
                           "marker": {"symbol": "diamond", "size": 10, "line": {"width": 1}},
                           "hovertemplate": "%{meta[0]}<br>held-out %{meta[1]} %{y:.4g} after "
                                            "step %{x}<extra></extra>"})  # fmt: skip
            shown.append(np.array([row[metric]], dtype=float))
    if not shown:
        return None
    values = np.concatenate(shown)
    name = f"training {metric} per step" + (" (diamonds: held out)" if held_out is not None else "")
    return figure(traces, name, "step", title(metric), (), values)


def history(points: pd.DataFrame, metric: str, params: list[str]) -> dict | None:
    """A metric across an experiment's sweeps by the sweep's start time, a line per point (its
    varying `params`), as in asv; the hover at a sweep lists every line's value there under
    the sweep's id, commit, torch version and device (an unlabelled trace of one text per
    sweep, not one per point); its legend names the lines by what varies, each cut to
    LEGEND_CHARS, and of more than LEGEND_LINES lines it has none, the hover naming each line.
    `points`: a line per point of each sweep (sweep, started_at, provenance, parameters,
    metrics)."""
    if metric not in points:
        return None
    data = points[points["status"] == "ok"].dropna(subset=[metric, "started_at"])
    if data.empty:
        return None
    data = data.assign(when=data["started_at"].dt.strftime("%Y-%m-%d %H:%M:%S"))
    named = varying(data, params)
    groups = list(data.groupby(named, dropna=False, sort=True)) if named else [((), data)]
    few = len(groups) <= LEGEND_LINES  # else no legend: the hover names the line under it
    traces = []
    for key, line in groups:
        line = line.sort_values("started_at")
        said = label(dict(zip(named, _tuple(key), strict=True)), named)
        traces.append({"type": "scatter", "mode": "lines+markers" if len(line) <= MARKERS
                       else "lines", "name": plain(_cut(said)), "x": line["when"].tolist(),
                       "y": typed(line[metric], "f8"), "showlegend": few, "meta": plain(said),
                       "hovertemplate": "%{y:.4g}" if few else "%{meta}<br>%{x}: %{y:.4g}"
                                        "<extra></extra>"})  # fmt: skip
    sweeps = data.drop_duplicates("sweep").sort_values("started_at")
    text = [
        plain(f"sweep {s} · commit {str(c)[:10]} · torch {t} · {d}")
        for s, c, t, d in zip(sweeps["sweep"], sweeps.get("git_commit", [None] * len(sweeps)),
                              sweeps.get("torch_version", [None] * len(sweeps)),
                              sweeps.get("device_name", [None] * len(sweeps)), strict=True)
    ]  # fmt: skip
    low = float(data[metric].min())
    traces.append({"type": "scatter", "mode": "markers", "name": "sweep", "showlegend": False,
                   "x": sweeps["when"].tolist(), "y": typed(np.full(len(sweeps), low), "f8"),
                   "text": text, "marker": {"opacity": 0}, "hovertemplate": "%{text}"})  # fmt: skip
    lines = "" if few else f" ({len(groups)} lines: hover names one)"
    fig = figure(traces, f"{metric} across sweeps{lines}", "sweep started (UTC)", title(metric),
                 (), data[metric])  # fmt: skip
    fig["layout"]["hovermode"] = "x unified" if few else "closest"
    return fig


LEGEND_LINES = 8  # a history of more lines than this has no legend
LEGEND_CHARS = 32  # a legend entry longer than this is cut (its hover has it whole)


def _cut(text: str) -> str:
    return text if len(text) <= LEGEND_CHARS else text[: LEGEND_CHARS - 1] + "…"


FIGURES = 8  # the most metrics drawn for an experiment that draws none of its own


def axis(rows: pd.DataFrame, config: dict, params: list[str]) -> str | None:
    """The x axis of an experiment's plots: its declared table's index (config `table`; the
    last of several that varies, the innermost of the grid), else its swept parameter with the
    most values (the first of them, in the grid's order), else None (a single point: nothing
    to draw a line through)."""
    index = (config.get("table") or {}).get("index")
    listed = index if isinstance(index, list) else [index]
    declared = [n for n in listed if isinstance(n, str) and n in rows and rows[n].nunique() > 1]
    if declared:
        return declared[-1]
    counts = {p: rows[p].astype(str).nunique() for p in params if p in rows}
    counts = {p: n for p, n in counts.items() if n > 1 and numeric(rows[p])}
    return max(counts, key=counts.get) if counts else None


def metric_figures(
    rows: pd.DataFrame, x: str, params: list[str], shown: set[str], config: dict
) -> list[dict]:
    """A figure per metric of the ok rows (up to FIGURES) that no figure in `shown` has,
    against `x`, a line per other parameter that varies: those the experiment's `plots` names,
    in its order (none for []); without one, its table's values first, then each other
    numeric metric but the timings' housekeeping (housekeeping: repeats, spreads, load,
    clocks)."""
    ok = rows[rows["status"] == "ok"] if "status" in rows else rows
    skip = {*params, *shown, *store.HARNESS_COLUMNS, "experiment", "sweep"}
    named = config.get("plots")
    if named is not None:  # [] draws none
        metrics = [m for m in named if m in ok and m not in skip]
    else:
        values = (config.get("table") or {}).get("values")
        ordered = [values, *ok.columns] if isinstance(values, str) else list(ok.columns)
        metrics = list(dict.fromkeys(c for c in ordered if c in ok and not housekeeping(c)))
        metrics = [c for c in metrics if c not in skip]
    metrics = [c for c in metrics if numeric(ok[c]) and ok[c].notna().any()]
    settings = [p for p in params if p != x and p in ok]
    drawn = (lines(ok, x, m, settings, m, hover=settings) for m in metrics[:FIGURES])
    return [fig for fig in drawn if fig is not None]


# How a time was taken rather than what was measured (the columns harness.measuring.timing writes
# beside each timing, with or without a timing's prefix: sdpa_repeats, sdpa_cpu_load_beside):
# drawn as error bars or not at all, never as a plot of its own. harness.measuring.columns decides.
housekeeping = is_housekeeping
numeric = is_number_column  # a column of numbers, not booleans


def claim_figures(
    tables: dict[str, pd.DataFrame], claims: list[dict], x: str, params: list[str]
) -> list[dict]:
    """A figure per claim on a metric of the rows (not a derived table): the metric against
    `x` over the points its `where` selects, a line per parameter (of `params`) that varies
    there, its bounds drawn (with_bounds)."""
    rows, shown = tables.get("rows", pd.DataFrame()), []
    if x not in rows:
        return []
    for claim in claims:
        if claim.get("table", "rows") != "rows" or claim["metric"] not in rows:
            continue
        where = claim.get("where")
        try:
            data = expressions.select(rows, where) if where else rows
        except Exception:  # the claim's own line says why (claims.check: ERROR)
            continue
        data = data[data["status"] == "ok"] if "status" in data else data
        settings = [p for p in params if p != x and p in data]
        name = claim.get("text") or claim["metric"]
        fig = lines(data, x, claim["metric"], settings, name, hover=settings)
        if fig is None:
            continue
        bounds = {side: _listed(claim[side]) for side in ("min", "max") if side in claim}
        try:
            shown.append(with_bounds(fig, data, x, bounds, settings))
        except Exception:  # a bound outside the grammar: the claim's own line says ERROR
            continue
    return shown


def _tuple(key) -> tuple:
    """A groupby key as a tuple, whether it grouped by one column or several."""
    return key if isinstance(key, tuple) else (key,)


def _listed(bound) -> list:
    return list(bound) if isinstance(bound, list | tuple) else [bound]
