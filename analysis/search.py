"""A search's part of the report (harness.searching.search): each cell's best trial with its
parameters, and, from the cell's study, Optuna's own Plotly figures: the optimization history and
the parameters' importance (fANOVA, once a cell has two trials with a value)."""

import pandas as pd

from harness import store
from harness.searching import search

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
            drawn.append(importance.to_dict())
    return drawn
