"""python -m harness history EXPERIMENT --confirm: each step the history found, checked on the
exact code of the two sweeps it lies between. The two sweeps run again with the gate
(harness.command.again: each on its own pinned code, in turns, until every timing is decided),
ordered so that the gate's "slower" is the step: the sweep before it as A where its timing
grew, the sweep after it as A where it fell. The step stands where the gate fails (exit 1);
then the two codes' difference (harness.command.code). A step of a metric that is no timing is
not rerun: the gate judges timings alone.

The steps come from the report layer (octlm_analysis.history) as plain values, a Pair each
two sweeps: this module reads none of it.
"""

from dataclasses import dataclass

from harness.command.again import again
from harness.command.code import code

STANDS = 1  # the gate's exit code where B is slower than A by more than its factor
SAID = {STANDS: "the step stands", 0: "the step does not stand", 3: "the step is not decided"}


@dataclass(frozen=True)
class Pair:
    before: str  # the sweep before the step(s)
    after: str  # and the one after
    grew: bool  # the timings' steps rose (else fell)
    worse: bool  # a step between them made a metric worse
    timings: tuple[str, ...]  # the steps' timings, in words (metric at point)
    others: tuple[str, ...]  # the steps of metrics that are no timing
    commits: tuple[str, str]  # the two sweeps' commits ("" where one recorded none)
    metric: str  # the step a bisection follows: the pair's first worse step, else its first
    point: dict
    log: bool  # that step judged on a log scale


def confirm(pairs: list[Pair], out: str, code_store: str | None, check: bool) -> int:
    """Each pair rerun by the gate, whether its steps stand said, and the codes' difference;
    with `check` 1 where a worse step stands, else 0 (a rerun's failure: its code)."""
    stood = False
    for pair in pairs:
        print(f"\nconfirming {', '.join(pair.timings or pair.others)}: sweeps {pair.before} and "
              f"{pair.after}")  # fmt: skip
        if not pair.timings:
            print(f"not rerun: no timing (the gate judges timings); python -m harness report "
                  f"compare {pair.before} {pair.after} shows them")  # fmt: skip
        else:
            a, b = (pair.before, pair.after) if pair.grew else (pair.after, pair.before)
            verdict = again([a, b], out, code_store)
            if verdict not in (0, STANDS, 3):
                return verdict
            print(f"{SAID[verdict]} on the two codes ({'slower' if pair.grew else 'faster'}: "
                  f"the gate of {b} against {a})")  # fmt: skip
            stood |= verdict == STANDS and pair.worse
        code([pair.before, pair.after], out, code_store)
    return 1 if check and stood else 0
