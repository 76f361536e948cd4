"""Steps in a history: where a series of values, one a sweep in the order the sweeps were
planned, changed its level, and whether it did by more than chance.

The detector is binary segmentation by Welch's t. For a segment of a series, every split that
leaves at least `side` values either side is scored by Welch's t of the two parts' means (their
spreads not assumed equal: a slower code is often a noisier one too), as the gate judges a
timing: the test that the ratio after/before lies beyond a factor (1.10, the gate's TOLERANCE)
either way, since a machine drifts by a few percent over a day with no code changed, and a
step of 5% found among fifty sweeps is that drift as often as the code. The split of the
smallest p is the segment's candidate (of the largest t where several p values underflow to 0).
Its p value is that smallest p times the number of splits tried (Bonferroni: the chance that
any split of a segment without a step scores so, at most that). A series is judged on a log
scale where all its values are above zero (a timing's step is a ratio, as in the gate), else as
it is, where any change counts.

Across the series one history judges (every metric of every point), the family rule is Holm's,
as the gate's: the series' candidates in rising p, the k-th (from 0) a step while p <= alpha /
(m - k), so that a history of identical code shows any step at most `alpha` of the time, however
many series it has. A series' candidates come first from binary segmentation looking for a
change of any size (a split passing alpha, then each part split again, and so on: a series may
hold several steps), then each is tested beyond the factor between its neighbouring
candidates, placed again at the best split there and dropped where it no longer passes (as
Otava merges its change points), until none moves; the smallest p among a series' candidates
enters Holm's rule, and a series it rejects keeps the candidates that pass the level it was
rejected at. Each step's ratio after/before (its parts' geometric means, between its
neighbouring steps) and its interval come from octlm_analysis.verdicts.estimate, the gate's
Welch interval. Before any of it, octlm_analysis.history sets aside the timings of the sweeps
that a busy moment slowed as a whole (slowed_sweeps).

Why this detector: tests/benchmarks/history_calibration.py compares it with PELT (ruptures, a
penalty of BIC's form) on the same null and step histories; docs/performance.md has the rates.
PELT's penalty gives no p value, so no family rule over a history's many series, and one penalty
fits no set of series whose spreads differ; this one's false alarms are bounded by alpha where
Welch's t holds, and measured where the noise is this machine's; its statistics are numpy's
cumulative sums: a 1,000-sweep series is scored in one pass.
"""

import math
import warnings
from dataclasses import dataclass

import numpy as np

from octlm_analysis.verdicts import TOLERANCE, estimate, holm

ALPHA = 0.05  # the chance that a history of identical code shows a step, over all its series
SIDE = 3  # the fewest sweeps either side of a step


@dataclass(frozen=True)
class Step:
    series: int  # which of the series judged
    at: int  # the first value after the step
    start: int  # the values before it, from start (the previous step, or 0)
    end: int  # and after it, to end (the next step, or the series' length)
    log: bool  # judged on a log scale: `change` is a ratio after/before, else a difference
    change: float
    low: float  # change's 95% interval
    high: float
    p: float  # the candidate's p value (Bonferroni over its segment's splits)


def scores(values: np.ndarray, side: int, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """Welch's t of |after - before| - margin and its degrees of freedom for each split k of
    `values` (side <= k <= len - side), from cumulative sums."""
    x = values - values.mean()  # centred: the sums of squares lose nothing to cancellation
    n = len(x)
    k = np.arange(side, n - side + 1)
    s1, s2 = np.cumsum(x), np.cumsum(x * x)
    left_sum, left_sq = s1[k - 1], s2[k - 1]
    right_sum, right_sq = s1[-1] - left_sum, s2[-1] - left_sq
    n1, n2 = k.astype(float), (n - k).astype(float)
    m1, m2 = left_sum / n1, right_sum / n2
    v1 = np.maximum(left_sq - n1 * m1 * m1, 0) / (n1 - 1)
    v2 = np.maximum(right_sq - n2 * m2 * m2, 0) / (n2 - 1)
    a, b = v1 / n1, v2 / n2
    se2 = a + b
    beyond = np.abs(m2 - m1) - margin
    with np.errstate(divide="ignore", invalid="ignore"):
        t = beyond / np.sqrt(se2)
        df = se2 * se2 / (a * a / (n1 - 1) + b * b / (n2 - 1))
    alike = se2 <= 1e-24 * max(1.0, float(np.abs(values).max()) ** 2)  # each part one value
    t = np.where(alike, np.where(beyond > 1e-12, np.inf, -np.inf if margin else 0.0), t)
    return np.nan_to_num(t, nan=0.0), np.where(np.isfinite(df), df, n - 2.0)


def candidate(values: np.ndarray, side: int, margin: float = 0.0) -> tuple[int, float] | None:
    """The segment's best split (as an index into `values`) and its p value, Bonferroni over the
    splits tried: of |after - before| > margin (one-sided), or with no margin of any change
    (two-sided); None where the segment is too short to split."""
    from scipy import stats  # here: importing scipy.stats takes a second

    if len(values) < 2 * side:
        return None
    t, df = scores(values, side, margin)
    t = t if margin else np.abs(t)
    p = stats.t.sf(t, df) * (1 if margin else 2)
    # the smallest p, and among splits whose p underflows to 0 (a long series' clear step) the
    # largest t: they would all tie
    best = int(np.lexsort((-t, p))[0])
    return side + best, min(1.0, float(p[best]) * len(p))


def find_steps(series: list[np.ndarray], side: int = SIDE, alpha: float = ALPHA,
               factor: float = TOLERANCE) -> list[Step]:  # fmt: skip
    """The steps of a history's series (each its values in the sweeps' order, NaN-free), found
    under the module's family rule; in series order, then by position."""
    logs = [_scaled(np.asarray(s, dtype=float)) for s in series]
    margins = [math.log(factor) if log else 0.0 for _, log in logs]
    cuts = [_candidates(v, side, m, alpha) for (v, _), m in zip(logs, margins, strict=True)]
    p_values = [min((p for _, p in c), default=1.0) for c in cuts]
    found = []
    for index, level in sorted(_rejected(p_values, alpha).items()):
        (values, log), margin = logs[index], margins[index]
        kept = _settled(values, cuts[index], side, level, margin)
        found += _steps(index, values, log, kept)
    return found


def _candidates(values: np.ndarray, side: int, margin: float, loose: float) -> list[tuple]:
    """A series' candidate steps (position, p): the changes of any size that binary
    segmentation finds at `loose`, then each tested beyond `margin` between its neighbours
    (_settled, at `loose` too). A rise and fall back within a long series changes the whole
    series' mean by less than either step: looking for any change first finds both."""
    first = candidate(values, side)
    if first is None or first[1] > loose:
        return []
    liberal = _split(values, 0, len(values), first, side, loose, 0.0)
    return _settled(values, liberal, side, loose, margin)


def _rejected(p_values: list[float], alpha: float) -> dict[int, float]:
    """Holm's rule (verdicts.holm): each series rejected, with the level it was rejected at."""
    order = np.argsort(p_values, kind="stable")
    rejected = holm(p_values, alpha)
    return {int(i): alpha / (len(p_values) - k) for k, i in enumerate(order) if rejected[i]}


WINDOW = 5  # the sweeps around a sweep whose median is its series' level there
FEWEST = 3  # the fewest timings a sweep needs for its shift to be judged


def slowed_sweeps(logs: np.ndarray, factor: float = TOLERANCE) -> np.ndarray:
    """Which sweeps (rows of `logs`: a sweep's log timings, a column a series, NaN where it has
    none) a busy moment slowed as a whole: where the median over its timings of each one's
    distance above its level (the median of the WINDOW sweeps around it in its series) is
    beyond the factor. A step of the code moves the level with it (a median of five keeps a
    step of three sweeps whole), and one timing's step moves no median over many."""
    sweeps, series = logs.shape
    if sweeps < WINDOW or series < FEWEST:
        return np.zeros(sweeps, dtype=bool)
    half = WINDOW // 2
    padded = np.pad(logs, ((half, half), (0, 0)), mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, WINDOW, axis=0)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a window of NaN: no level there
        above = logs - np.nanmedian(windows, axis=2)
        shift = np.nanmedian(above, axis=1)
    counted = np.sum(np.isfinite(above), axis=1) >= FEWEST
    return counted & (shift > math.log(factor))


def _scaled(values: np.ndarray) -> tuple[np.ndarray, bool]:
    """A series on a log scale where every value is above zero, else as it is."""
    if len(values) and np.all(values > 0):
        return np.log(values), True
    return values, False


def _split(values, start: int, end: int, first, side: int, level: float,
           margin: float) -> list[tuple]:  # fmt: skip
    """The cuts (position, p) of values[start:end], given its candidate `first` found
    significant: it, and those of each part that pass `level`."""
    at, p = first
    cut = start + at
    cuts = [(cut, p)]
    for lo, hi in ((start, cut), (cut, end)):
        inner = candidate(values[lo:hi], side, margin)
        if inner is not None and inner[1] <= level:
            cuts += _split(values, lo, hi, inner, side, level, margin)
    return cuts


def _settled(values: np.ndarray, cuts: list[tuple], side: int, level: float,
             margin: float) -> list[tuple]:  # fmt: skip
    """The cuts, each placed again at its best split between its neighbours and dropped where
    that split no longer passes `level` (as Otava merges change points), until none moves: a
    series that rose and fell back is first cut where the whole series splits best, which is
    neither of its steps."""
    cuts = sorted(cuts)
    for _ in range(len(values)):
        settled, moved = [], False
        for n in range(len(cuts)):
            start = settled[-1][0] if settled else 0
            end = cuts[n + 1][0] if n + 1 < len(cuts) else len(values)
            found = candidate(values[start:end], side, margin)
            if found is None or found[1] > level:
                moved = True
                continue
            settled.append((start + found[0], found[1]))
            moved |= settled[-1][0] != cuts[n][0]
        cuts = settled
        if not moved:
            break
    return cuts


def _steps(index: int, values: np.ndarray, log: bool, cuts: list[tuple]) -> list[Step]:
    """Each cut as a Step, its change measured between its neighbouring cuts."""
    bounds = [0, *(c for c, _ in cuts), len(values)]
    steps = []
    for n, (cut, p) in enumerate(cuts):
        before, after = values[bounds[n] : cut], values[cut : bounds[n + 2]]
        change, low, high = _change(before, after, log)
        steps.append(Step(index, cut, bounds[n], bounds[n + 2], log, change, low, high, p))
    return steps


def _change(before: np.ndarray, after: np.ndarray, log: bool) -> tuple[float, float, float]:
    """after/before (geometric means) with its 95% interval, the gate's (verdicts.estimate); of
    a series not on a log scale, after - before with Welch's interval."""
    if log:
        found = estimate(np.exp(before), np.exp(after), factor=1.0, tail=0.025)
        return found.ratio, found.low, found.high
    from scipy import stats

    difference = float(after.mean() - before.mean())
    if np.std(before) == 0 and np.std(after) == 0:
        return difference, difference, difference
    low, high = stats.ttest_ind(after, before, equal_var=False).confidence_interval(0.95)
    return difference, float(low), float(high)


def worse(step: Step, direction: int) -> bool:
    """Whether a step made its metric worse: `direction` +1 where higher is worse (a timing,
    a metric below a claim's max), -1 where lower is, 0 where neither (no step is worse)."""
    grew = step.change > 1 if step.log else step.change > 0
    return direction != 0 and grew == (direction > 0)


def said(step: Step) -> str:
    """A step's change in words: x1.49 [1.42, 1.57], or +0.3 [0.2, 0.4] off a log scale."""
    if step.log:
        return f"x{step.change:.3g} [{step.low:.3g}, {step.high:.3g}]"
    return f"{step.change:+.3g} [{step.low:+.3g}, {step.high:+.3g}]"
