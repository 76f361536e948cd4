"""exp015_backends in the report: time and memory per length and backend, speedups, growth, plots.

Memory is whichever column the device has, named as measured: rss_delta_mib (CPU, resident
memory over the baseline) or cuda_peak_mib (the CUDA allocator's peak over the baseline).
"""

from pathlib import Path

import matplotlib
import pandas as pd

from analysis.report import markdown

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

SHAPE = ["device_used", "dtype", "batch", "heads", "head_dim", "causal"]  # one table each
MEMORY = ["cuda_peak_mib", "rss_delta_mib"]


def measurements(rows: pd.DataFrame) -> pd.DataFrame:
    """The ok rows, with memory_mib, memory_kind (the column it came from), memory_over_inputs."""
    ok = rows[rows["status"] == "ok"].copy()
    kinds = [column for column in MEMORY if column in ok]
    ok["memory_kind"] = ok[kinds].notna().idxmax(axis=1) if kinds else None
    ok["memory_mib"] = ok[kinds].bfill(axis=1).iloc[:, 0] if kinds else float("nan")
    ok["memory_over_inputs"] = ok["memory_mib"] / ok["inputs_mib"]
    return ok


def speedup(rows: pd.DataFrame) -> pd.DataFrame:
    """Per shape and length: math's median time over each other backend's (flash_over_math...)."""
    times = measurements(rows).pivot_table(
        index=_shape(rows) + ["length"], columns="backend", values="time_ms"
    )
    if "math" not in times:
        return pd.DataFrame()
    others = [backend for backend in times if backend != "math"]
    ratios = pd.DataFrame({f"{b}_over_math": times["math"] / times[b] for b in others})
    return ratios.reset_index()


def growth(rows: pd.DataFrame) -> pd.DataFrame:
    """Per shape and backend: memory and time at each length over those at half the length."""
    data = measurements(rows).set_index(_shape(rows) + ["backend", "length"])
    half = data.rename(index=lambda length: length * 2, level="length")
    ratios = pd.DataFrame(
        {
            "memory_growth": data["memory_mib"] / half["memory_mib"],
            "time_growth": data["time_ms"] / half["time_ms"],
        }
    ).dropna(how="all")
    return ratios.reset_index()


def tables(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {"measurements": measurements(rows), "speedup": speedup(rows), "growth": growth(rows)}


def sections(rows: pd.DataFrame, derived: dict, folder: Path) -> list[str]:
    """Tables per shape (length x backend), speedup, growth, the plots, the refusals."""
    parts = []
    for shape, group in rows.groupby(_shape(rows), dropna=False):
        parts.append(f"{_describe(dict(zip(_shape(rows), shape, strict=True)), group)}:")
        parts.append(markdown(time_and_memory(group)))
    for name, caption in (
        ("speedup", "Speedup over math (math's median time / the backend's)"),
        ("growth", "Growth per doubling of length (value at L / value at L/2)"),
    ):
        if not derived[name].empty:
            shown = derived[name].drop(columns=sorted(set(_shape(rows)) - set(_varying(rows))))
            parts += [f"{caption}:", markdown(shown.set_index(_varying(rows)), ".2f")]
    parts += [f"![{what} vs length]({path.name})" for what, path in plots(rows, folder).items()]
    refused = rows[rows["status"] == "unsupported"]
    for (device, backend), group in refused.groupby(["device_used", "backend"]):
        parts.append(f"{backend} on {device} is unsupported: {group['error'].iloc[0]}")
    return parts


def time_and_memory(rows: pd.DataFrame) -> pd.DataFrame:
    """length x backend: "median ms (IQR) / memory MiB", or the status of a point without one."""
    cells = rows.assign(cell=rows["status"])
    ok = measurements(rows)
    cells.loc[ok.index, "cell"] = [
        f"{t:.3g} ms ±{iqr:.2g} · {m:.4g} MiB"
        for t, iqr, m in zip(ok["time_ms"], ok["time_iqr_ms"], ok["memory_mib"], strict=True)
    ]
    table = cells.pivot_table(index="length", columns="backend", values="cell", aggfunc="first")
    order = rows.sort_values("job")["backend"].drop_duplicates()
    return table.reindex(columns=order)


def plots(rows: pd.DataFrame, folder: Path) -> dict[str, Path]:
    """Memory and time against length, log-log, one line per backend and dtype per device."""
    data = measurements(rows)
    paths = {}
    if data.empty:
        return paths
    for what, column, unit in (("memory", "memory_mib", "MiB"), ("time", "time_ms", "ms")):
        devices = sorted(data["device_used"].unique())
        figure, axes = plt.subplots(1, len(devices), figsize=(6 * len(devices), 4), squeeze=False)
        for axis, device in zip(axes[0], devices, strict=True):
            on_device = data[data["device_used"] == device]
            for (backend, dtype), line in on_device.groupby(["backend", "dtype"]):
                line = line.groupby("length")[column].median()
                axis.loglog(line.index, line.values, marker="o", label=f"{backend} {dtype}")
            kind = on_device["memory_kind"].iloc[0] if what == "memory" else "median time"
            axis.set(title=f"{device}: {kind}", xlabel="length", ylabel=unit)
            axis.set_xticks(sorted(on_device["length"].unique()), minor=False)
            axis.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize="small")
        figure.tight_layout()
        paths[what] = folder / f"exp015_backends-{what}.png"
        figure.savefig(paths[what], dpi=100)
        plt.close(figure)
    return paths


def _shape(rows: pd.DataFrame) -> list[str]:
    return [column for column in SHAPE if column in rows]


def _varying(rows: pd.DataFrame) -> list[str]:
    """The shape columns that tell this sweep's points apart: the device, and what varies."""
    return [c for c in _shape(rows) if c == "device_used" or rows[c].nunique(dropna=False) > 1]


def _describe(shape: dict, rows: pd.DataFrame) -> str:
    device = shape.pop("device_used", "?")
    names = ", ".join(rows["device_name"].dropna().unique()) if "device_name" in rows else ""
    memory = measurements(rows)["memory_kind"].dropna().unique()
    settings = ", ".join(f"{k} {v}" for k, v in shape.items())
    label = f"{device} ({names})" if names else device
    return f"{label}, {settings}: median time ±IQR · {'/'.join(memory) or 'memory'}"
