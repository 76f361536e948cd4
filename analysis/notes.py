"""A researcher's note whose numbers are bound to the store: the bindings and blocks as written.

A note is plain Markdown. A binding is one line's `{{ EXPERIMENT METRIC REDUCER [where EXPR]
[sweep ID|tag:NAME|last] -> VALUE }}`: the value the note states (VALUE), and where it comes
from. A block is a fenced `harness-table` (EXPERIMENT [where EXPR] [sweep ...]: the
experiment's declared `table:`) or `harness-figure` (EXPERIMENT METRIC [where EXPR] [sweep
...]: the metric drawn against the sweep's parameter). On GitHub all of it reads as it stands:
the bindings as text with their values, the blocks as code. Bindings inside other fenced blocks
and code spans are text, left as they are.

A VALUE binds at the place of its last written digit: `3.1e-07` at 1e-08, `0.00031` at 1e-05,
`4,928` and `2` at units. The recomputed value stands while, rounded half to even at that
place, it is the written value (so a count or any integer stands only as itself); a verdict or
a text stands only as itself. This module parses and compares; octlm_analysis.note_values
computes the values from the store, octlm_analysis.note_render writes the note.
"""

import re
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from harness.names import closest
from harness.results import expressions

REDUCERS = ("min", "max", "mean", "median", "last", "count", "verdict")
VERDICTS = ("PASS", "FAIL", "INCOMPLETE", "N/A", "ERROR")
BLOCKS = ("harness-table", "harness-figure")
BINDING = re.compile(r"\{\{(?P<inside>[^{}\n]*?)\}\}")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>```+|~~~+)\s*(?P<info>\S*)")
CODE = re.compile(r"(`+)[^`].*?\1")  # a code span: what it holds is text
SWEEP = re.compile(r"(?:^|\s)sweep\s+(?P<sweep>\S+)\s*$")
NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")


class BadBinding(ValueError):
    """A binding or block that cannot work as written: its message is one line, with the
    line of the note, and what was meant where it can tell."""


@dataclass
class Binding:
    """One binding or block of a note: where it lies (line, the span of its text in the note),
    what it reads, and the value the note states (None: none written yet)."""

    line: int
    start: int
    end: int
    experiment: str
    metric: str | None
    reducer: str
    where: str | None = None
    sweep: str | None = None
    written: str | None = None
    block: str | None = None  # a fenced block's kind (BLOCKS), None for an inline binding
    text: str = field(default="", repr=False)

    def said(self) -> str:
        """The binding as a message names it: `{{ ... -> 2 }}`, or a block's kind and words."""
        if self.block:
            return f"{self.block} block `{self.source()}`"
        return f"{{{{{self.text}}}}}"

    def source(self) -> str:
        """The binding as a note writes it, less its value: `exp014_tiled max_abs_diff max`."""
        parts = [self.experiment, self.metric or "", "" if self.block else self.reducer]
        parts += [f"where {self.where}" if self.where else "", f"sweep {self.sweep}" if self.sweep
                  else ""]  # fmt: skip
        return " ".join(p for p in parts if p)


def parse(text: str) -> tuple[list[Binding], list[tuple[int, str]]]:
    """A note's bindings and blocks in order, and its bad ones: (line, what is wrong in one
    line, with the name meant where one is near: "no reducer 'maxx' ...; did you mean max?")."""
    found, bad = [], []
    for line, start, end, kind, body in _pieces(text):
        try:
            found.append(_block(line, start, end, kind, body) if kind else _inline(
                line, start, end, body))  # fmt: skip
        except BadBinding as error:
            bad.append((line, str(error)))
    return found, bad


def _pieces(text: str):
    """(line, start, end, block kind or None, text inside) for each binding outside fenced
    blocks and each harness block."""
    offset, fenced = 0, None  # fenced: (fence, kind, line, start of body)
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        opened = FENCE.match(line)
        if fenced is None and opened:
            fenced = (opened["fence"], opened["info"], number, offset, offset + len(line))
        elif fenced is not None and line.strip().startswith(fenced[0]) and not line.strip(
        ).strip(fenced[0][0]):  # fmt: skip
            fence, kind, first, start, body = fenced
            if kind in BLOCKS:
                yield first, start, offset + len(line), kind, text[body:offset]
            fenced = None
        elif fenced is None:
            code = [span.span() for span in CODE.finditer(line)]
            for match in BINDING.finditer(line):
                if not any(a <= match.start() < b for a, b in code):  # `{{ ... }}` is text
                    yield number, offset + match.start(), offset + match.end(), None, match[
                        "inside"]  # fmt: skip
        offset += len(line)


def _inline(line: int, start: int, end: int, inside: str) -> Binding:
    """`EXPERIMENT METRIC REDUCER [where EXPR] [sweep ID] -> VALUE` read."""
    left, arrow, written = inside.rpartition("->")
    if not arrow:
        left, written = inside, None
    else:
        written = written.strip()
        if not written:
            raise BadBinding(f"{{{{{inside}}}}} has nothing after ->: write the value it states")
    words = left.split(None, 3)
    if len(words) < 3:
        raise BadBinding(f"{{{{{inside}}}}} needs EXPERIMENT METRIC REDUCER [where EXPR] "
                         "[sweep ID] -> VALUE")  # fmt: skip
    experiment, metric, reducer = words[:3]
    if reducer not in REDUCERS:
        raise BadBinding(f"no reducer {reducer!r} (they are {', '.join(REDUCERS)})"
                         f"{closest(reducer, REDUCERS)}")  # fmt: skip
    where, sweep = _where_and_sweep(words[3] if len(words) > 3 else "")
    if reducer == "verdict" and where:
        raise BadBinding("a verdict is its claim's, over the points its own where selects: "
                         "drop the binding's where")  # fmt: skip
    if reducer == "verdict" and written is not None and written not in VERDICTS:
        raise BadBinding(f"a verdict is one of {', '.join(VERDICTS)}, not {written!r}"
                         f"{closest(written.upper(), VERDICTS)}")  # fmt: skip
    return Binding(line, start, end, experiment, metric, reducer, where, sweep, written,
                   text=inside)  # fmt: skip


def _block(line: int, start: int, end: int, kind: str, body: str) -> Binding:
    """A harness-table (EXPERIMENT ...) or harness-figure (EXPERIMENT METRIC ...) block read."""
    words = " ".join(body.split()).split(None, 2 if kind == "harness-figure" else 1)
    wanted = 2 if kind == "harness-figure" else 1
    if len(words) < wanted:
        what = "EXPERIMENT METRIC" if wanted == 2 else "EXPERIMENT"
        raise BadBinding(f"a {kind} block holds {what} [where EXPR] [sweep ID]")
    metric = words[1] if wanted == 2 else None
    where, sweep = _where_and_sweep(words[wanted] if len(words) > wanted else "")
    return Binding(line, start, end, words[0], metric, kind.removeprefix("harness-"), where,
                   sweep, block=kind, text=body)  # fmt: skip


def _where_and_sweep(rest: str) -> tuple[str | None, str | None]:
    """The `where EXPR` and `sweep ID` that follow a binding's first words."""
    rest = rest.strip()
    found = SWEEP.search(rest)
    sweep = found["sweep"] if found else None
    rest = rest[: found.start()].strip() if found else rest
    if not rest:
        return None, sweep
    if not rest.startswith("where "):
        word = rest.split()[0]
        raise BadBinding(
            f"{word!r} where `where EXPR` or `sweep ID` goes{closest(word, ['where', 'sweep'])}"
        )
    where = rest.removeprefix("where ").strip()
    try:
        expressions.parse(where)
    except expressions.ExpressionError as error:
        raise BadBinding(f"its where: {error}") from None
    return where, sweep


def place(written: str) -> int | None:
    """The exponent of a written number's last digit (`3.1e-07`: -8, `4,928`: 0); None for a
    text that is no number (a verdict)."""
    if not NUMBER.fullmatch(written):
        return None
    return Decimal(written.replace(",", "")).as_tuple().exponent


def stands(written: str, value) -> bool:
    """Whether a recomputed value is the written one at the precision it was written with."""
    exponent = place(written)
    if exponent is None or isinstance(value, str):
        return str(value) == written
    try:
        rounded = Decimal(repr(float(value))).quantize(Decimal(1).scaleb(exponent), ROUND_HALF_EVEN)
    except (InvalidOperation, ValueError, OverflowError):
        return False
    return rounded == Decimal(written.replace(",", ""))


def written_like(value, written: str | None) -> str:
    """A recomputed value as the note would write it: in the written value's form (its
    exponent's significant digits, its decimals, its thousands' commas), or for a value not
    written yet, an integer or one of 100 or more whole (with commas), anything else to two
    significant digits."""
    if isinstance(value, str):
        return value
    value = float(value)
    if written is None or place(written) is None:
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value)}"
        if 100 <= abs(value) < 1e15:
            return f"{value:,.0f}"
        return f"{value:.1e}" if value and abs(value) < 1e-3 else f"{value:.2g}"
    mantissa, e, _ = written.lower().partition("e")
    if e:
        digits = len(mantissa.lstrip("+-").replace(".", "").lstrip("0")) or 1
        shown = f"{value:.{digits - 1}e}"
        if not re.search(r"e[-+]?0\d", written.lower()):  # 4.8e-7, not 4.8e-07
            shown = re.sub(r"e([-+]?)0(\d)", r"e\1\2", shown)
        return shown.replace("e+", "e") if "e+" not in written.lower() else shown
    decimals = max(0, -place(written))
    return f"{value:,.{decimals}f}" if "," in written else f"{value:.{decimals}f}"
