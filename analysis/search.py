"""A search's part of the report (harness.searching.search): each cell's best trial with its
parameters, and, from the cell's study, Optuna's own Plotly figures: the optimization history and
the parameters' importance (fANOVA, once a cell has two trials with a value), its parameters'
names plain text (octlm_analysis.plots.plain), never inside a hover template."""

import pandas as pd

from harness import store
from harness.searching import search
from octlm_analysis.plots import plain

IMPORTANCE_TRIALS = 2  # the complete trials an importance needs


def best_table(best: pd.DataFrame, searched: dict, params: list[str]) -> pd.DataFrame:
    """The best table (harness.searching.search.best_rows) as the report shows it: cell, the grid's
    parameters that vary, the trial and its searched parameters, the objective, its state."""
    if best.empty:
        return best
    grid = [p for p in params if p in best and p not in searched["params"]]
    grid = [p for p in grid if best[p].nunique(dropna=False) > 1]
    shown = ["cell", *grid, "trial", *searched["params"], searched["objective"], "status"]
    table = best.reindex(columns=shown)
    return table.assign(status=table["status"].replace({"ok": "ended", "running": "so far"}))


def figures(sweep: store.SweepPaths) -> list[dict]:
    """Each cell's optimization history and parameter importances, as Plotly figure dicts."""
    import optuna.visualization as shown

    drawn = []
    for cell, study in sorted(search.studies(sweep.folder).items()):
        complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
        if not complete:
            continue
        history = shown.plot_optimization_history(study)
        history.update_layout(title=f"cell {cell}: optimization history")
        drawn.append(history.to_dict())
        if len(complete) >= IMPORTANCE_TRIALS:
            importance = shown.plot_param_importances(study)
            importance.update_layout(title=f"cell {cell}: parameter importance (fANOVA)")
            drawn.append(_plain_names(importance.to_dict(), complete))
    return drawn


def _plain_names(importance: dict, trials: list) -> dict:
    """Optuna's importance figure with its parameters' names (its bars' y, their hover: name,
    distribution and importance) as plain text, each hover's name in `customdata`."""
    kinds = {name: type(d).__name__ for t in trials for name, d in t.distributions.items()}
    for trace in importance["data"]:
        names = list(trace.get("y") or [])
        trace["y"] = [plain(name) for name in names]
        trace["customdata"] = [plain(f"{name} ({kinds.get(name, '?')})") for name in names]
        trace["hovertemplate"] = "%{customdata}: %{x}<extra></extra>"
    return importance
