"""The gate's statistics (octlm_analysis.verdicts) against numbers fixed elsewhere: Welch's
interval as the hand-written formula gave it before scipy computed it, and Holm's rule as its
published example and statsmodels decide it."""

import numpy as np
import pytest

from octlm_analysis.verdicts import estimate, holm, processes_to_decide, verdict

# (A's processes, B's, factor, tail) -> (ratio, low, high, p_slower, log_se) and the processes a
# side that would decide it, as the hand-written Welch interval (t quantile and Welch-Satterthwaite
# freedom of the log values, by hand) gave them before scipy.stats.ttest_ind replaced it.
WELCH = [
    (([10.0, 10.1, 9.9, 10.2, 9.8], [5.0, 5.1, 4.9, 5.2, 4.8], 1.10, 0.05),
     (0.4998498948993876, 0.4846650734100108, 0.5155104651404577, 0.9999999970280218,
      0.015818428598962948), 5),
    (([10, 14, 18, 22, 26], [12, 17, 22, 27, 32], 1.10, 0.05),
     (1.2188605035805882, 0.777404555367399, 1.911001057212258, 0.3412626301875999,
      0.241817389464534), 76),
    (([2.0, 2.02, 1.98, 2.01, 1.99], [2.6, 2.62, 2.58, 2.61, 2.59], 1.10, 0.05),
     (1.3000132701962046, 1.2891825453093844, 1.3109349865426914, 4.1281406739041787e-10,
      0.004460667415553503), 5),
    (([10.0, 10.8], [10.6, 9.9], 1.10, 0.05 / 3),
     (0.9857315388414163, 0.7456320406339295, 1.3031450014414139, 0.9157487322961424,
      0.05145512838972139), 2),
    (([10.0, 10.8, 10.1], [10.6, 9.9, 10.1, 10.05], 1.25, 0.05 / 2),
     (0.9869051473217102, 0.9075679989928165, 1.0731777353222827, 0.9989568314855513,
      0.02833030315276536), 4),
    (([1.0, 1.01, 0.99], [1.12, 1.13, 1.11], 1.10, 0.05),
     (1.120007572134596, 1.101611357401804, 1.1387109920484357, 0.040596995063175045,
      0.007740190674575718), 3),
]  # fmt: skip


@pytest.mark.parametrize("given, expected, to_decide", WELCH)
def test_welchs_interval_from_scipy_gives_the_hand_written_numbers(given, expected, to_decide):
    a, b, factor, tail = given
    found = estimate(a, b, factor, tail)
    said = (found.ratio, found.low, found.high, found.p_slower, found.log_se)
    assert said == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert (found.n_a, found.n_b) == (len(a), len(b))
    assert processes_to_decide(found, factor, tail) == to_decide


def test_sides_whose_processes_agree_exactly_have_a_known_ratio():
    """Every process of each side alike: no spread, the t undefined; the ratio is the answer."""
    found = estimate([2.0, 2.0], [2.5, 2.5], factor=1.10, tail=0.05)
    assert (found.ratio, found.low, found.high) == pytest.approx((1.25, 1.25, 1.25))
    assert found.p_slower == 0.0 and found.log_se == 0.0
    assert estimate([2.0, 2.0], [2.1, 2.1], factor=1.10, tail=0.05).p_slower == 1.0


# Holm's step-down rule, Wikipedia's worked example ("Holm-Bonferroni method", Example: four
# hypotheses, p = 0.01, 0.04, 0.03, 0.005 at alpha = 0.05; H1 and H4 rejected, H2 and H3 not).
# statsmodels.stats.multitest.multipletests(p, method="holm") adjusts them to 0.03, 0.06, 0.06,
# 0.02 (sorted p times 4, 3, 2, 1, then their running maximum): a hypothesis is rejected at
# alpha exactly where its adjusted p is at most alpha.
HOLM_P = [0.01, 0.04, 0.03, 0.005]
HOLM_ADJUSTED = [0.03, 0.06, 0.06, 0.02]


@pytest.mark.parametrize(
    "alpha, rejected",
    [
        (0.05, [True, False, False, True]),  # the worked example's decisions
        (0.01, [False, False, False, False]),  # 0.005 > 0.01 / 4
        (0.025, [False, False, False, True]),  # 0.005 <= 0.025 / 4, then 0.01 > 0.025 / 3
        (0.045, [True, False, False, True]),  # 0.03 > 0.045 / 2: the step down stops
        (0.07, [True, True, True, True]),
    ],
)
def test_holm_decides_as_the_published_example_and_statsmodels(alpha, rejected):
    assert holm(HOLM_P, alpha) == rejected
    assert rejected == [adjusted <= alpha for adjusted in HOLM_ADJUSTED]


def test_holm_keeps_a_small_p_behind_a_larger_one_it_keeps():
    """Step-down: 0.04 is below alpha / 1 yet kept, since 0.03 before it was not rejected."""
    assert holm([0.03, 0.04], 0.05) == [False, False]
    assert holm([0.02, 0.04], 0.05) == [True, True]


def test_the_interval_is_welchs_on_the_logs_as_scipy_gives_it():
    """Against scipy's own Welch test of the log values (ttest_ind, equal_var=False): each end
    of the interval a one-sided 95% bound, so the two-sided 90% interval."""
    from scipy import stats

    a, b = [10.0, 10.4, 9.7, 10.1], [12.2, 12.9, 11.8]
    found = estimate(a, b, factor=1.10, tail=0.05)
    welch = stats.ttest_ind(np.log(b), np.log(a), equal_var=False)
    low, high = welch.confidence_interval(0.90)
    assert (found.low, found.high) == (pytest.approx(np.exp(low)), pytest.approx(np.exp(high)))
    shifted = stats.ttest_ind(np.log(b) - np.log(1.10), np.log(a), equal_var=False,
                              alternative="greater")  # fmt: skip
    assert found.p_slower == pytest.approx(shifted.pvalue)
    assert found.ratio == pytest.approx(np.exp(np.log(b).mean() - np.log(a).mean()))


def test_holm_steps_down_and_stops_at_the_first_it_keeps():
    assert holm([0.01, 0.04, 0.03], 0.05) == [True, False, False]  # 0.03 > 0.05 / 2
    assert holm([0.01, 0.02, 0.04], 0.05) == [True, True, True]  # 0.01, 0.02 <= 0.025, 0.04
    assert holm([0.2, 0.04], 0.05) == [False, False] and holm([], 0.05) == []


@pytest.mark.parametrize(
    "b, expected",
    [
        ([1.30, 1.32, 1.29], "slower"),
        ([0.70, 0.71, 0.69], "faster"),
        ([1.00, 1.01, 0.99], "same"),
        ([0.88, 0.93, 0.99], "same or faster"),
        ([1.05, 1.10, 1.16], "ambiguous"),  # beyond 1.10 or within it: not told apart
    ],
)
def test_each_verdict_from_the_interval_and_the_factor(b, expected):
    found = estimate([1.0, 1.01, 0.99], b, factor=1.10, tail=0.05)
    assert verdict(found, slower=holm([found.p_slower], 0.05)[0], factor=1.10) == expected
