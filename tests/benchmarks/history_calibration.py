"""The history's step detector, measured: false alarms over histories of identical code, power
for known steps, and the seconds a long history takes; beside it PELT (ruptures), the detector
it was compared with.

Real sweeps first: `--sweeps` sweeps of the probe experiment `pair` (tests/support: two prefixed
timings, `first` and `second`, of `products` products of 128 x 128 matrices, one thread) over
products=10,20,40,80,160 (5 points x 2 timings: 10 series), each by a command of its own with
nothing reused, as a user's sweeps of unchanged code are; read back as `python -m harness
history` reads them (octlm_analysis.point_lines, a value a sweep), busy or not. Then:
- the real history as it is, judged whole;
- `--histories` null histories resampled from it: 12 of its sweeps drawn without replacement, in
  a random order (a sweep's 10 values together, as they were measured);
- as many simulated: each series' log values normal with the spread measured (its MAD), and
  again with Student's t (3 degrees of freedom) tails of the same spread;
- power: a step of 10%, 25% and 50% in one series of the ten (drawn anew for each history) at
  the middle of a history of 6 sweeps a side and of 3 a side, the values before and after
  resampled from the real sweeps (after: times the step), and simulated.
A history alarms where either detector finds any step; a step is found where one lies in the
stepped series exactly at the step. Prints a table of rates; asserts nothing.
Run: python tests/benchmarks/history_calibration.py [--sweeps 16] [--histories 400] [--store DIR]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SUPPORT)])}
PAIR = ["--config-dir", str(SUPPORT / "conf"), "+experiment=pair", "reuse=false",
        "products=10,20,40,80,160", "min_time_s=0.05"]  # fmt: skip
STEPS = (1.10, 1.25, 1.50)
LENGTH = 12  # sweeps a null history


def sweeps(out: Path, count: int) -> None:
    """`count` sweeps of `pair` into out, each its own process."""
    for n in range(count):
        done = subprocess.run([sys.executable, "-m", "harness", *PAIR, f"out={out}"],
                              capture_output=True, text=True, env=ENV, cwd=out)  # fmt: skip
        if done.returncode != 0 or not re.search(r"^sweep \S+: \d+ points", done.stdout, re.M):
            sys.exit(f"sweep {n} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        print(f"sweep {n + 1} of {count}", file=sys.stderr)


def measured(out: Path) -> tuple[np.ndarray, np.ndarray]:
    """The real sweeps' values, a row a sweep and a column a series (metric x point), in the
    order planned, read as history reads them; and each value's CPU load beside it."""
    from octlm_analysis import history, point_lines

    points = point_lines.of_experiment(out / "results", "pair", out / "report")
    order = history.sweep_lines(points)["sweep"].tolist()
    columns, loads = [], []
    for metric in ("first_time_ms", "second_time_ms"):
        load = metric.replace("time_ms", "cpu_load_beside")
        table = points.pivot_table(index="sweep", columns="products", values=[metric, load])
        columns += [table[metric][p].reindex(order).to_numpy() for p in table[metric]]
        loads += [table[load][p].reindex(order).to_numpy() for p in table[load]]
    return np.column_stack(columns), np.column_stack(loads)


def pelt_alarms(series: list[np.ndarray], side: int, scale: float = 1.0) -> list[list[int]]:
    """PELT (ruptures, an L2 cost on the log values) on each series, with BIC's penalty,
    2 * sigma^2 * log(n) times `scale`, sigma from the MAD of successive differences: each
    series' steps."""
    import ruptures

    found = []
    for values in series:
        logs = np.log(values)
        sigma = 1.4826 * np.median(np.abs(np.diff(logs) - np.median(np.diff(logs)))) / np.sqrt(2)
        penalty = scale * 2 * max(sigma, 1e-9) ** 2 * np.log(len(logs))
        cuts = ruptures.Pelt(model="l2", min_size=side, jump=1).fit(logs).predict(pen=penalty)
        found.append(cuts[:-1])
    return found


def ours(series: list[np.ndarray], side: int) -> list[list[int]]:
    """The chosen detector as the command judges timings: the sweeps a busy moment slowed as
    a whole set aside (steps.slowed_sweeps), then find_steps; each series' steps, as
    positions in the history given."""
    from octlm_analysis.steps import find_steps, slowed_sweeps

    kept = ~slowed_sweeps(np.log(np.column_stack(series)))
    where = np.flatnonzero(kept)
    found = [[] for _ in series]
    for step in find_steps([s[kept] for s in series], side):
        found[step.series].append(int(where[step.at]))
    return found


DETECTORS = {"binary segmentation + Welch + Holm (chosen)": ours, "PELT, BIC penalty": pelt_alarms}
CALIBRATED = "PELT, penalty raised to 5% false alarms"


def calibrate_pelt(histories: list[np.ndarray]) -> float:
    """The smallest of BIC's penalty's multiples (1, 1.5, 2, 3, ...) at which PELT alarms in at
    most 5% of `histories`; PELT with it joins DETECTORS."""
    for scale in (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64):
        rate = np.mean([any(pelt_alarms(list(h.T), 3, scale)) for h in histories])
        if rate <= 0.05:
            break
    DETECTORS[CALIBRATED] = lambda series, side: pelt_alarms(series, side, scale)
    return scale


def null_rates(histories: list[np.ndarray]) -> dict[str, float]:
    """Each detector's share of `histories` (sweeps x series) with any step."""
    return {name: np.mean([any(detect(list(h.T), 3)) for h in histories])
            for name, detect in DETECTORS.items()}  # fmt: skip


QUIET = 0.05  # a series whose spread (the MAD of its log values) is at most this is quiet


def power(before, after, factor: float, rng, spread) -> dict[str, tuple]:
    """Each detector's share of histories whose stepped series (one of the ten, drawn anew for
    each history) has a step at the boundary (found): of all, of those whose stepped series is
    quiet (`spread` at most QUIET) and of the others; and the share whose other series have any
    (false alarms). Histories of `before` then `after`, its stepped series x factor (lists of
    sweeps x series arrays)."""
    chosen = rng.integers(before[0].shape[1], size=len(before))
    quiet = np.asarray(spread)[chosen] <= QUIET
    rates = {}
    for name, detect in DETECTORS.items():
        hits, others = [], []
        for b, a, stepped in zip(before, after, chosen, strict=True):
            a = a.copy()
            a[:, stepped] *= factor
            found = detect(list(np.vstack([b, a]).T), 3)
            hits.append(len(b) in found[stepped])
            others.append(any(f for n, f in enumerate(found) if n != stepped))
        hits = np.asarray(hits)
        rates[name] = (hits.mean(), _share(hits[quiet]), _share(hits[~quiet]), np.mean(others))
    return rates


def _share(hits: np.ndarray) -> str:
    return f"{hits.mean():.1%}" if len(hits) else "none"


def resampled(values: np.ndarray, count: int, length: int, rng) -> list[np.ndarray]:
    return [values[rng.choice(len(values), length, replace=False)] for _ in range(count)]


def simulated(spread: np.ndarray, count: int, length: int, rng, tails: bool) -> list[np.ndarray]:
    """Histories of log values normal (or t with 3 degrees of freedom, scaled to the same
    MAD) with each series' `spread`."""
    shape = (count, length, len(spread))
    # t(3)'s MAD is 0.765 (a normal's 0.674 x 1.4826 = 1): scaled to the same spread
    noise = rng.standard_t(3, shape) / 0.765 if tails else rng.standard_normal(shape)
    return list(np.exp(noise * spread))


def timed_long_history(rng) -> float:
    """Seconds to judge 1,000 sweeps of 10 series, two steps in one, best of three."""
    from octlm_analysis.steps import find_steps

    series = [np.exp(rng.normal(0, 0.03, 1000)) for _ in range(10)]
    series[3][400:] *= 1.25
    series[3][700:] /= 1.25
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        found = find_steps(series)
        best = min(best, time.perf_counter() - started)
    print(f"long history: {len(found)} steps found at {[s.at for s in found]}", file=sys.stderr)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=16)
    parser.add_argument("--histories", type=int, default=400)
    parser.add_argument(
        "--store",
        type=Path,
        help="an out folder for the sweeps, kept: those "
        "made before are judged again, and where it has none they are made",
    )
    arguments = parser.parse_args()
    rng = np.random.default_rng(63)
    with tempfile.TemporaryDirectory() as folder:
        out = arguments.store or Path(folder)
        if not (out / "results" / "experiment=pair").is_dir():
            out.mkdir(parents=True, exist_ok=True)
            sweeps(out, arguments.sweeps)
        values, loads = measured(out)
        report(values, loads, arguments.histories, rng)


def report(values: np.ndarray, loads: np.ndarray, count: int, rng) -> None:
    logs = np.log(values)
    spread = 1.4826 * np.median(np.abs(logs - np.median(logs, axis=0)), axis=0)
    print(f"{len(values)} real sweeps x {values.shape[1]} series; spread (MAD of log values) "
          f"median {np.median(spread):.3f}, {spread.min():.3f} to {spread.max():.3f}; CPU load "
          f"beside median {np.nanmedian(loads):.2f}, most {np.nanmax(loads):.2f}")  # fmt: skip
    print(
        "the real history judged whole: steps by detector:",
        {name: sum(map(len, detect(list(values.T), 3))) for name, detect in DETECTORS.items()},
    )
    scale = calibrate_pelt(simulated(spread, count, LENGTH, rng, False))
    print(
        f"PELT's penalty raised to {scale} x BIC's: at most 5% false alarms on simulated "
        "normal histories"
    )
    nulls = {
        f"resampled real, {LENGTH} sweeps": resampled(values, count, LENGTH, rng),
        f"simulated normal, {LENGTH} sweeps": simulated(spread, count, LENGTH, rng, False),
        f"simulated t(3) tails, {LENGTH} sweeps": simulated(spread, count, LENGTH, rng, True),
    }
    print("\nfalse alarms (histories with any step):")
    for kind, histories in nulls.items():
        rates = null_rates(histories)
        print(f"  {kind}: " + "; ".join(f"{n}: {r:.1%}" for n, r in rates.items()))
    print(
        "\npower (step found at its place in a series drawn for each history; false alarms in "
        "the other 9 series):"
    )
    for side in (6, 3):
        for factor in STEPS:
            for kind in ("resampled real", "simulated normal"):
                if kind == "resampled real":
                    both = (
                        resampled(values, count, 2 * side, rng)
                        if 2 * side <= len(values)
                        else [values[rng.choice(len(values), 2 * side)] for _ in range(count)]
                    )
                else:
                    both = simulated(spread, count, 2 * side, rng, False)
                rates = power(
                    [h[:side] for h in both], [h[side:] for h in both], factor, rng, spread
                )
                said = "; ".join(f"{n}: {all_:.1%} (quiet {q}, noisy {loud}; {o:.1%})"
                                 for n, (all_, q, loud, o) in rates.items())  # fmt: skip
                print(f"  {side} a side, +{factor - 1:.0%}, {kind}: {said}")
    print(f"\n1,000 sweeps x 10 series judged in {timed_long_history(rng):.3f} s (best of 3)")


if __name__ == "__main__":
    main()
