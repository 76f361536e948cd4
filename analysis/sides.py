"""A side of a comparison (octlm_analysis.compare): one sweep, or several sweeps of one grid, each
made by a command of its own and so in processes of its own (`compare A1,A2,A3 B1,B2,B3`),
whose rows say which sweep each came from (SWEEP_INDEX), and the side's claims: of several sweeps,
each claim's worst result among them.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness import files, store
from harness.errors import one_line
from harness.results.claims import claims_table
from octlm_analysis.report import trusted_config

SWEEP_INDEX = "sweep_index"  # the row's sweep among its side's (0, 1, ...): a process of its own


class CompareError(Exception):
    """A comparison that cannot be made: one line for the user."""


class DamagedSide(CompareError):
    """A side whose rows cannot all be trusted: nothing is judged from it (exit 1)."""


@dataclass
class Side:
    id: str
    experiment: str
    manifest: dict
    rows: pd.DataFrame  # of a side of several sweeps: each row's SWEEP_INDEX says whose
    config: dict  # the experiment config its claims are checked by
    parts: list["Side"] | None = None  # a side of several sweeps: each of them


def load(results: Path, given: str, config_dirs: list[Path] = ()) -> Side:
    """A side of the comparison: a sweep by its id, or several sweeps of one grid (ids joined
    by commas), each a process of its own, as one Side whose rows say whose (SWEEP_INDEX)."""
    ids = given.split(",")
    if len(set(ids)) < len(ids):
        raise CompareError(f"{given} names a sweep twice: a side's sweeps are its processes")
    parts = [_sweep(results, sweep_id, config_dirs) for sweep_id in ids]
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    for other in parts[1:]:
        if other.experiment != first.experiment:
            raise CompareError(
                f"sweep {first.id} is {first.experiment} and sweep {other.id} is "
                f"{other.experiment}: a side's sweeps are one grid's"
            )
        if _grid(other.manifest) != _grid(first.manifest):
            raise CompareError(
                f"sweeps {first.id} and {other.id} are not of one grid: a side's sweeps run "
                "the same points, each in processes of its own"
            )
    rows = pd.concat([p.rows.assign(**{SWEEP_INDEX: n}) for n, p in enumerate(parts)],
                     ignore_index=True)  # fmt: skip
    return Side(given, first.experiment, first.manifest, rows, first.config, parts)


def _sweep(results: Path, sweep_id: str, config_dirs: list[Path]) -> Side:
    """A sweep by its id, whichever experiment it belongs to (its report module as the
    experiment's own config, in conf/ or a config dir, names it: report.trusted_config)."""
    experiment = store.experiment_of(results, sweep_id)
    if experiment is None:
        raise CompareError(f"no sweep {sweep_id} in {results}")
    paths = store.SweepPaths(results, experiment, sweep_id)
    manifest = store.read_manifest(paths)
    if manifest is None:
        raise CompareError(f"sweep {sweep_id} has no manifest ({store.MANIFEST}) in {results}")
    _check_files(paths)
    rows = store.as_planned(store.read(results, experiment, sweep_id), manifest, results)
    config = trusted_config(manifest, experiment, config_dirs)
    return Side(sweep_id, experiment, manifest, rows, config)


def _check_files(sweep: store.SweepPaths) -> None:
    """DamagedSide where a row file of the sweep is damaged (a flipped byte, a cut file): every
    other reader skips it, naming it, but a gate that judged what is left would judge a sweep
    with points or rows missing as if it were whole."""
    sweep_id = sweep.sweep
    for path in store.result_files(sweep.root, sweep.experiment, sweep_id):
        try:
            store.read_job_file(path)
        except files.DamagedFile as damaged:
            raise DamagedSide(
                f"sweep {sweep_id}'s {path.name} ({path.parent}) is damaged: {damaged.reason}; "
                f"nothing is judged from it (python -m harness resume={sweep_id} runs its "
                "point again)"
            ) from None


def _grid(manifest: dict) -> list[str]:
    """A sweep's points' parameters, as sorted text: what sweeps of one grid share."""
    return sorted(json.dumps(p.get("params", {}), sort_keys=True, default=str)
                  for p in manifest["points"])  # fmt: skip


WORST_FIRST = ("ERROR", "FAIL", "INCOMPLETE", "N/A", "PASS")


def side_claims(side: Side) -> pd.DataFrame:
    """The side's claims (claims_table, by claim): of a side of several sweeps, each claim's
    worst result among its sweeps, and where they differ, the worst one's sweep named."""
    each = [_claims(one) for one in side.parts or [side]]
    if len(each) == 1:
        return each[0]
    lines = pd.concat([t.assign(sweep=one.id) for t, one in zip(each, side.parts, strict=True)])
    rank = lines["result"].map({r: n for n, r in enumerate(WORST_FIRST)}).fillna(-1)
    worst = lines.assign(rank=rank).sort_values("rank", kind="stable")
    worst = worst[~worst.index.duplicated()]
    differ = lines.groupby(level=0)["result"].nunique() > 1
    worst["worst"] = (
        worst["worst"]
        .astype(str)
        .where(
            ~differ.reindex(worst.index),
            worst["worst"].astype(str) + " (in " + worst["sweep"] + ")",
        )
    )
    return worst.drop(columns=["rank", "sweep"])


def _claims(sweep: Side) -> pd.DataFrame:
    """One sweep's claims_table, by claim; an ERROR line where the tables its experiment
    derives cannot be made of its rows (as the report says of such a sweep)."""
    try:
        return claims_table(sweep.rows, sweep.config, sweep.manifest["points"]).set_index("claim")
    except Exception as error:
        line = {"result": "ERROR", "worst": f"{type(error).__name__}: {one_line(error)[:200]}"}
        return pd.DataFrame([line], index=pd.Index(["the sweep's claims can be checked"],
                                                   name="claim"))  # fmt: skip
