"""A timing's verdict between two sides of a comparison, each a set of processes.

A process's timing (the median of its repeats) is one value: repeats estimate their process,
and processes are the unit, since the same code timed in two processes differs by more than
either's repeats show. Each side's values are compared on a log scale: the ratio B/A is the
ratio of their geometric means, and its interval is Welch's t interval of the difference of
the mean logs, exponentiated (two sides of few processes each, their spreads not assumed
equal). Each end of the interval is a one-sided bound at 1 - `tail`.

With a factor f (the gate's, or TOLERANCE):
  slower          B/A > f: its one-sided test (B/A <= f rejected) passes the family rule
  faster          the interval lies below 1/f
  same            the interval lies within [1/f, f] (two one-sided tests: equivalence)
  same or faster  the interval ends within f, and starts below 1/f
  ambiguous       the interval reaches beyond f, and the family rule does not call it slower

The family rule is Holm's: over the m timings a gate judges, their p values in rising order,
the k-th (from 0) rejected while p <= alpha / (m - k). The chance that any of them is called
slower when none is, is then at most alpha, however many there are.
"""

import math
import warnings
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05  # the chance a gate calls identical code slower, over all its timings together
TOLERANCE = 1.10  # the factor of a comparison without a gate


@dataclass(frozen=True)
class Estimate:
    ratio: float  # B/A: the ratio of the sides' geometric means
    low: float  # the interval's ends
    high: float
    p_slower: float  # the one-sided p value of "B/A is at most the factor"
    n_a: int  # processes a side
    n_b: int
    log_se: float  # the standard error of the log ratio


def estimate(a, b, factor: float, tail: float) -> Estimate:
    """B/A of the processes' values `a` and `b` (each at least two, each above 0), its
    interval at one-sided confidence 1 - tail at each end, and the p value of B/A <= factor:
    Welch's t test of the logs (scipy.stats.ttest_ind, equal_var=False)."""
    from scipy import stats  # here: importing scipy.stats takes a second

    log_a, log_b = np.log(np.asarray(a, dtype=float)), np.log(np.asarray(b, dtype=float))
    difference = log_b.mean() - log_a.mean()
    se = math.hypot(stats.sem(log_a), stats.sem(log_b))
    if se == 0:  # every process of each side alike: the ratio is known (the t is undefined)
        beyond = difference > math.log(factor)
        return Estimate(math.exp(difference), math.exp(difference), math.exp(difference),
                        0.0 if beyond else 1.0, len(log_a), len(log_b), 0.0)  # fmt: skip
    with warnings.catch_warnings():  # a side whose processes all gave one value is no loss
        warnings.filterwarnings("ignore", "Precision loss", RuntimeWarning)
        welch = stats.ttest_ind(log_b, log_a, equal_var=False)
        low, high = welch.confidence_interval(1 - 2 * tail)  # two-sided: each end 1 - tail
        shifted = stats.ttest_ind(log_b - math.log(factor), log_a, equal_var=False,
                                  alternative="greater")  # fmt: skip
    return Estimate(math.exp(difference), math.exp(low), math.exp(high),
                    float(shifted.pvalue), len(log_a), len(log_b), se)  # fmt: skip


def holm(p_values: list[float], alpha: float) -> list[bool]:
    """Which hypotheses Holm's step-down rule rejects at family-wise level alpha."""
    rejected = [False] * len(p_values)
    for k, index in enumerate(np.argsort(p_values, kind="stable")):
        if p_values[index] > alpha / (len(p_values) - k):
            break
        rejected[index] = True
    return rejected


def verdict(found: Estimate, slower: bool, factor: float) -> str:
    """The timing's verdict (the module's table), `slower` as the family rule found it."""
    if slower:
        return "slower"
    if found.high < 1 / factor:
        return "faster"
    if found.high <= factor:
        return "same" if found.low >= 1 / factor else "same or faster"
    return "ambiguous"


def processes_to_decide(found: Estimate, factor: float, tail: float) -> int | None:
    """About how many processes a side would decide an ambiguous timing, were its ratio and
    spread to stay as they are (the interval narrows as one over the root of the processes);
    None where its ratio is the factor itself, which no number of processes decides."""
    from scipy import stats

    distance = abs(math.log(found.ratio) - math.log(factor))
    if distance == 0 or found.log_se == 0:
        return None
    reach = stats.norm.ppf(1 - tail) * found.log_se  # the t's freedom grows with the processes
    return max(found.n_a, found.n_b, math.ceil(max(found.n_a, found.n_b) * (reach / distance) ** 2))
