"""Claims' expressions (harness.results.expressions): what the grammar allows evaluates as pandas'
query and eval would; anything else, the planted exploits first, is refused and runs nothing, in a
manifest too; and the claims and table specs that cannot work are one line each."""

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from harness import store
from harness.errors import BadInput
from harness.names import CONF
from harness.planning.config import compose_config
from harness.planning.plan import plan
from harness.results import claims
from harness.results.claims import check, claims_table, validate
from harness.results.expressions import ExpressionError, compared, evaluate, parse, select
from harness.results.tables import sweep_table, validate_plots, validate_table

FRAME = pd.DataFrame(
    {
        "length": [64, 80, 96, 128],
        "block": [16, 16, 32, 32],
        "dtype": ["float32", "float16", "bfloat16", "float32"],
        "err": [1e-7, np.nan, 3e-7, 2e-6],
        "flag": [True, False, True, False],
    }
)

VALUES = [
    "length",
    "1.0e-6",
    "2 * err + 1.0e-6",
    "1.05 - err",
    "length - block",
    "length / block",
    "2.0 / length",
    "length ** 2",
    "2 ** -1",
    "length % 48",
    "-length",
    "+err",
    "(length + 1) * 2",
    "length - block * 2 ** 2 / 4",
    "True",
    "'float32'",
]
CONDITIONS = [
    "dtype == 'float32'",
    'dtype == "float32"',
    "dtype != 'float32'",
    "length < 80",
    "length <= 80",
    "length > 64",
    "length >= 80",
    "64 < length <= 96",
    "16 <= block < length < 128",
    "err > 1e-7",
    "err != 1e-7",
    "dtype in ['float16', 'bfloat16']",
    "dtype not in ('float16',)",
    "length in [64, 80]",
    "block not in [16]",
    "length == 64 and dtype == 'float32'",
    "length == 64 or block == 32",
    "length == 64 or block == 32 and dtype == 'float32'",
    "not (length == 64)",
    "flag",
    "not flag",
    "flag == True",
    "flag != False and length > 64",
    "err < 1e-6 or not flag",
    "length > 1 and not (dtype == 'float16' or err < 1e-7)",
    "length * 2 >= block * 8",
    "length % 32 == 0",
    "-length < -80",
    "length - 16 * block / 4 > 0",
]
EXPLOITS = [
    ('100 + @pd.io.common.os.system("touch FILE")', "invalid syntax"),
    ("__import__('os').system('touch FILE')", r"calls are not allowed: __import__\('os'\)"),
    ("length.__class__", "attributes are not allowed: length.__class__"),
    ("[c for c in ()]", "comprehensions are not allowed"),
    ("lambda: 1", "lambdas are not allowed"),
    ("x[0]", r"subscripts are not allowed: x\[0\]"),
    ("f(x)", r"calls are not allowed: f\(\.\.\.\)"),
    ("length + (lambda: __import__('os').system('touch FILE'))()", "calls are not allowed"),
    ("dtype in [open('FILE', 'w')]", "list of constants"),
]
REFUSED = [
    ("None", "the constant None"),
    ("1j", "the constant 1j"),
    ("b'x'", "the constant b'x'"),
    ("length // 2", "`//`"),
    ("length & 1", "`&`"),
    ("~flag", "`~`"),
    ("length @ block", "`@`"),
    ("length is 64", "`is`"),
    ("length if flag else block", "conditional expressions"),
    ("{1: 2}", "dicts"),
    ("{1}", "sets"),
    ("[1, 2]", "lists"),
    ("(length, block)", "tuples"),
    ("f'{length}'", "f-strings"),
    ("(n := 1)", "assignments"),
    ("dtype in [block]", "list of constants"),
    ("dtype in dtype", "list of constants"),
    ("length in [None]", "numbers, strings"),
    ("length +", "not an expression"),
    ("", "not an expression"),
    ("length\n+ 1", "not an expression"),
    ("+".join(["1"] * 100_000), "an expression of 199999 characters, over the 2000"),
    ("-" * 1990 + "1", "too deeply nested"),
    ("foo + 1", "unknown column 'foo'"),
    ("dtype * 3", "arithmetic takes numbers, and dtype"),
    ("'x' * 1000000000000", "arithmetic takes numbers"),
    ("9 ** 9 ** 9", r"cannot compute 9 \*\* 9 \*\* 9"),
    ("1 % 0", "cannot compute"),
    ("not length", "`not` takes true or false"),
    ("flag and length", "`and` takes true or false"),
]


def reference(text: str, answer) -> pd.Series:
    """pandas' answer as a Series over FRAME (eval gives a constant as it is)."""
    return answer if isinstance(answer, pd.Series) else pd.Series(answer, index=FRAME.index)


@pytest.mark.parametrize("text", VALUES + CONDITIONS)
def test_each_allowed_construct_evaluates_as_pandas_eval_does(text):
    expected = reference(text, FRAME.eval(text))
    pd.testing.assert_series_equal(
        evaluate(text, FRAME), expected, check_names=False, check_dtype=False
    )


@pytest.mark.parametrize("text", CONDITIONS)
def test_each_condition_selects_the_rows_pandas_query_does(text):
    pd.testing.assert_frame_equal(select(FRAME, text), FRAME.query(text))


@pytest.mark.parametrize("text, said", EXPLOITS)
def test_an_exploit_is_refused_and_runs_nothing(text, said, tmp_path):
    planted = text.replace("FILE", str(tmp_path / "FILE"))
    for attempt in (parse, lambda t: evaluate(t, FRAME), lambda t: select(FRAME, t)):
        with pytest.raises(ExpressionError, match=said) as refused:
            attempt(planted)
        assert "\n" not in str(refused.value)
    assert not (tmp_path / "FILE").exists()


@pytest.mark.parametrize("text, said", REFUSED)
def test_what_the_grammar_lacks_is_one_line_that_names_it(text, said):
    with pytest.raises(ExpressionError, match=said) as refused:
        evaluate(text, FRAME)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 200


def test_a_where_must_give_true_or_false_and_a_missing_truth_value_is_false():
    with pytest.raises(ExpressionError, match="a where must be true or false: 'length'"):
        select(FRAME, "length")
    ran = FRAME.assign(ran=pd.Series([True, None, False, True], dtype=object))
    assert select(ran, "ran").index.tolist() == [0, 3]
    assert select(ran, "not ran").index.tolist() == [1, 2]


def test_parsing_is_cached_and_says_which_columns_an_expression_uses():
    assert parse("2 * sdpa_err64 + 1.0e-6") is parse("2 * sdpa_err64 + 1.0e-6")
    assert parse("dtype == 'float32' and length > 1").names == {"dtype", "length"}
    assert parse("1 < 2").names == set()
    with pytest.raises(ExpressionError, match="an expression is text, not list"):
        parse(["length"])


def test_a_planted_manifest_runs_nothing_and_its_claims_are_errors(harness, analysis, tmp_path):
    ran = harness("+experiment=exp014_tiled", "length=64,80", "block=16", "heads=2")
    assert ran.returncode == 0, ran.stderr
    (sweep,) = store.sweeps(harness.results, "exp014_tiled")
    path = store.SweepPaths(harness.results, "exp014_tiled", sweep).folder / "_sweep.json"
    manifest = json.loads(path.read_text())
    first, second = manifest["experiment_config"]["claims"]
    first["max"] = f'100 + @pd.io.common.os.system("touch {tmp_path / "FILE"}")'
    second["where"] = f"__import__('os').system('touch {tmp_path / 'FILE2'}') == 0"
    path.write_text(json.dumps(manifest))
    plain, checked = analysis(), analysis("--check")
    assert not (tmp_path / "FILE").exists() and not (tmp_path / "FILE2").exists()
    assert (plain.returncode, checked.returncode) == (0, 1), plain.stderr + checked.stderr
    errors = [line for line in plain.stdout.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 2, plain.stdout
    assert "not an expression" in errors[0] and "calls are not allowed" in errors[1]
    rows = store.read(harness.results, "exp014_tiled", sweep)
    lines = claims_table(rows, manifest["experiment_config"], manifest["points"])
    assert lines["result"].tolist() == ["ERROR", "ERROR"]
    assert all("\n" not in reason for reason in lines["worst"])
    assert not (tmp_path / "FILE").exists() and not (tmp_path / "FILE2").exists()


BAD_CLAIMS = [
    ({"claims": "tiled matches"}, "claims must be a list of claims, not 'tiled matches'"),
    ({"claims": {"metric": "err"}}, "claims must be a list of claims, not {'metric': 'err'}"),
    ({"claims": ["err <= 1e-6"]}, "claim 1: a claim is a mapping of metric, min, max"),
    ({"claims": [{"metric": "err"}, {"max": 1e-6}]}, "claim 2: it has no metric"),
    ({"claims": [{"metric": "err", "maximum": 1}]}, r"claim 1 \(err\): unknown keys maximum"),
    ({"claims": [{"metric": 3}]}, "its metric must be text, not 3"),
    ({"claims": [{"metric": "err", "where": 1}]}, "its where must be text, not 1"),
    ({"claims": [{"metric": "err", "table": ["a"]}]}, "its table must be text"),
    ({"claims": [{"metric": "err", "max": True}]}, "its max: a bound is a number, arithmetic"),
    ({"claims": [{"metric": "err", "max": float("nan")}]}, "its max: a bound is a number"),
    ({"claims": [{"metric": "err", "min": {"x": 1}}]}, "its min: a bound is a number"),
    # A bound is a number: a comparison, a truth value or text as one would pass any value.
    ({"claims": [{"metric": "value", "min": "value > 3"}]},
     "its min: a bound is a number or arithmetic .* has the comparison `value > 3`"),
    ({"claims": [{"metric": "err", "max": "1e-5 + (length >= 64)"}]},
     "has the comparison `length >= 64`"),
    ({"claims": [{"metric": "err", "max": "True"}]}, "has the truth value True"),
    ({"claims": [{"metric": "err", "max": ["1e-5", "'tight'"]}]}, "has the text 'tight'"),
    ({"claims": [{"metric": "err", "max": "a and b"}]}, "has `and`"),
    ({"claims": [{"metric": "err", "min": "not err"}]}, "has `not`"),
    ({"claims": [{"metric": "err", "max": [1e-5, [1e-6]]}]}, r"not \[1e-06\]"),
    ({"claims": [{"metric": "err", "max": []}]}, "its max is an empty list"),
    ({"claims": [{"metric": "err", "max": "100 + @pd.io.common.os.system('x')"}]},
     "its max: not an expression"),
    ({"claims": [{"metric": "err", "max": [1e-5, "os.system('x')"]}]},
     r"its max: calls are not allowed: os.system\(\.\.\.\)"),
    ({"claims": [{"metric": "err", "where": "length =="}]}, "its where: not an expression"),
    ({"claims": [{"metric": "err", "where": "length > 1" + " or length > 1" * 200}]},
     "its where: an expression of 2810 characters, over the 2000"),
    ({"claims": [{"metric": "err", "max": [1.0] * 17}]}, "its max lists 17 bounds, over the 16"),
    ({"claims": [{"metric": "err", "where": "length.real > 0"}]},
     "its where: attributes are not allowed: length.real"),
    ({"derive": "octlm_experiments.derived.nowhere.tables"},
     "cannot import experiment.derive=octlm_experiments.derived.nowhere.tables: No module named"),
    ({"derive": "octlm_experiments.derived.backends.absent"},
     "cannot import experiment.derive=octlm_experiments.derived.backends.absent: module"),
    ({"derive": "octlm_experiments.derived.backends.SHAPE"},
     "experiment.derive=octlm_experiments.derived.backends.SHAPE is not a function of the rows"),
    ({"claims": [{"metric": "memory_growth", "table": "growth"}]},
     r"claim 1 \(memory_growth\): its table 'growth' is none the experiment derives: name"),
]  # fmt: skip
BAD_TABLES = [
    ("length", "table must be a mapping of index, columns, values, where, reduce, not 'length'"),
    (["length", "block"], "table must be a mapping"),
    ({"columns": "block", "values": "max_abs_diff"}, "table has no index"),
    ({}, "table has no index"),
    ({"index": "length"}, "table has no values"),
    ({"index": "length", "columns": [1], "values": "x"}, "table's columns must be a column name"),
    ({"index": 1, "columns": "block", "values": "x"}, "table's index must be a column name or a"),
    ({"index": [], "values": "x"}, "table's index must be a column name or a list of them"),
    ({"index": "length", "values": ["x", "y"]}, "table's values must be a column name, not"),
    ({"index": "length", "columns": ["block", "length"], "values": "x"}, "names length twice"),
    (
        {"index": "length", "values": "x", "rows": "block"},
        "table takes index, columns, values, where, reduce, not rows",
    ),
    (
        {"index": "length", "values": "x", "reduce": "median"},
        "table's reduce is one of last, min, max, mean, not 'median'",
    ),
    ({"index": "length", "values": "x", "where": 3}, "table's where must be a condition, not 3"),
    ({"index": "length", "values": "x", "where": "length >"}, "length >"),
]


@pytest.mark.parametrize(
    "claim, said",
    [({"metric": "err", "where": "length > 1" + " or length > 1" * 200}, "2810 characters"),
     ({"metric": "err", "max": [1.0] * 17}, "lists 17 bounds"),
     ({"metric": "err", "min": ["length - " + "1 - " * 600 + "1"]}, "2410 characters")],
)  # fmt: skip
def test_a_where_or_bound_over_the_limits_is_an_error_claim_of_one_line(claim, said):
    table = pd.DataFrame({"status": ["ok"] * 3, "length": [1, 2, 3], "err": [0.1, 0.2, 0.3]})
    line = check({"rows": table}, claim)
    assert line["result"] == "ERROR" and said in line["worst"] and "\n" not in line["worst"]


def test_a_claim_on_a_table_there_is_not_is_an_error_that_names_the_tables():
    """Not N/A: a claim whose table the experiment's derive does not make (a report module of
    the old kind, a derive dropped from the config) says so, and --check fails on it."""
    rows = pd.DataFrame({"status": ["ok"], "length": [1], "err": [0.1]})
    line = check({"rows": rows, "growth": rows}, {"metric": "err", "table": "speedup"})
    assert line["result"] == "ERROR"
    assert line["worst"] == "no table 'speedup' (the tables are rows, growth)"
    assert check({"rows": rows.iloc[:0]}, {"metric": "err", "table": "speedup"})["result"] == "N/A"


@pytest.mark.parametrize("config, said", BAD_CLAIMS)
def test_a_claims_spec_that_cannot_work_is_refused_in_one_line(config, said):
    with pytest.raises(ValueError, match=said) as refused:
        validate(config)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("path", sorted((CONF / "experiment").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_experiments_claims_and_table_are_valid(path):
    config = yaml.safe_load(path.read_text())["experiment"]
    validate(config)
    validate_table(config.get("table"))


def test_no_claims_and_no_table_are_valid():
    for config in ({}, {"claims": None}, {"claims": []}, {"claims": [{"metric": "err"}]}):
        validate(config)
    validate_table(None)


@pytest.mark.parametrize("spec", ["err64", ["err64", 3], [""], {"err64": 1}])
def test_plots_that_name_no_list_of_metrics_are_refused_in_one_line(spec):
    with pytest.raises(ValueError, match="plots must be a list of metrics") as refused:
        validate_plots(spec)
    assert "\n" not in str(refused.value)
    validate_plots(None)
    validate_plots(["err64", "time_ms"])


@pytest.mark.parametrize("spec, said", BAD_TABLES)
def test_a_table_spec_that_cannot_work_is_refused_and_the_report_skips_it(spec, said):
    with pytest.raises(ValueError, match=said) as refused:
        validate_table(spec)
    assert "\n" not in str(refused.value)
    rows = FRAME.assign(job=range(len(FRAME)), status="ok", max_abs_diff=FRAME["err"], x=1.0)
    assert sweep_table(rows, {"table": spec}) is None
    good = {"index": "length", "columns": "block", "values": "max_abs_diff"}
    assert sweep_table(rows, {"table": good}).shape == (4, 2)
    assert sweep_table(rows, {"table": {**good, "columns": "absent"}}) is None


# Three points, their parameters n and x; `zero` is 0 on the second only.
POINTS = [{"job": job, "params": {"n": n, "x": x}}
          for job, (n, x) in enumerate([(1, 1), (2, 1), (2, 2)])]  # fmt: skip
ROWS = pd.DataFrame({"job": [0, 1, 2], "status": "ok", "n": [1, 2, 2], "x": [1, 1, 2],
                     "value": [0.5, 0.7, 0.9], "zero": [1.0, 0.0, 1.0]})  # fmt: skip


@pytest.mark.parametrize(
    "key, bound, said",
    [("max", "value / zero", "at n=2 x=1 (inf)"),
     ("max", "value / (n - n)", "at n=1 x=1 (inf) and 2 more"),
     ("min", "-value / (x - 1)", "at n=1 x=1 (-inf) and 1 more"),
     ("max", "(x - 1) / (x - 1)", "at n=1 x=1 (nan) and 1 more"),
     ("max", "value % (n - n)", "at n=1 x=1 (nan) and 2 more"),
     ("max", ["value / zero", 1.0], "at n=2 x=1 (inf)")],
)  # fmt: skip
def test_a_bound_that_is_no_finite_number_on_a_row_is_an_error_that_names_the_row(key, bound, said):
    """A division by zero over a column gives inf or NaN on its row (as pandas does): an upper
    bound of inf would pass anything, and a NaN one would count the point as missing."""
    claim = {"metric": "value", key: bound}
    (line,) = claims_table(ROWS, {"claims": [claim]}, POINTS).itertuples()
    expression = bound[0] if isinstance(bound, list) else bound
    assert line.result == "ERROR"
    assert claims.outcome(line) == f"the bound {expression} is not a finite number {said}"


def test_a_bound_of_constants_that_divides_by_zero_is_an_error_too():
    (line,) = claims_table(ROWS, {"claims": [{"metric": "value", "max": "value * (1 / 0)"}]},
                           POINTS).itertuples()  # fmt: skip
    assert line.result == "ERROR" and "cannot compute 1 / 0: division by zero" in line.worst


def test_a_bound_missing_for_a_missing_input_counts_the_point_as_missing():
    """Not an error: the bound reads `ref`, which the failed point has not."""
    failed = ROWS.assign(status=["ok", "ok", "failed"], ref=[1.0, 2.0, np.nan])
    claim = {"metric": "value", "max": "value / ref + 0.5"}
    (line,) = claims_table(failed, {"claims": [claim]}, POINTS).itertuples()
    assert (line.result, line.missing) == ("INCOMPLETE", "n=2 x=2 (failed)")


def test_the_comparisons_of_a_column_with_a_constant_are_listed_column_first():
    text = ("1 < length <= '4' and dtype in ['a', 2] and not (flag == True) and length == block "
            "or -2 >= err or length + 1 > 3")  # fmt: skip
    assert list(compared(parse(text))) == [
        ("length", ">", 1), ("length", "<=", "4"), ("dtype", "in", "a"), ("dtype", "in", 2),
        ("flag", "==", True), ("err", "<=", -2),
    ]  # fmt: skip
    assert [type(c) for _, _, c in compared(parse("flag != True and 1 == n"))] == [bool, int]


@pytest.mark.parametrize(
    "claim, values, said",
    [({"where": "n == '2'"}, {"n": [1, 2]},
      "its where compares n, an integer parameter, with the text '2': write n == 2"),
     ({"where": "dtype == 1"}, {"dtype": ["float32", "float16"]},
      "its where compares dtype, a text parameter, with the number 1: write dtype == '1'"),
     ({"where": "causal == 1"}, {"causal": [True, False]},
      "its where compares causal, a true-or-false parameter, with the number 1: "
      "write causal == True"),
     ({"where": "n != True"}, {"n": [1, 2]},
      "its where compares n, an integer parameter, with the truth value True: write n != 1"),
     ({"needs": "'4' < n"}, {"n": [1, None, 8]},
      "its needs compares n, an integer parameter, with the text '4': write n > 4"),
     ({"where": "dtype in ['float32', 16]"}, {"dtype": ["float32"]},
      "its where compares dtype, a text parameter, with the number 16: write '16' in its list"),
     ({"where": "lr > 'small'"}, {"lr": [0.1, 1]},
      "its where compares lr, a number parameter, with the text 'small'")],
)  # fmt: skip
def test_a_where_comparing_a_parameter_with_a_constant_of_another_kind_is_refused(
    claim, values, said
):
    """It would select none of the points, silently: the claim N/A on every sweep."""
    with pytest.raises(ValueError) as refused:
        validate({"claims": [{"metric": "value", **claim}]}, list(values), values=values)
    assert str(refused.value) == f"claim 1 (value): {said}"


@pytest.mark.parametrize(
    "where, values",
    [("n == 2.0 and n > 1.5", {"n": [1, 2]}),
     ("dtype == 'float32' and flag == True", {"dtype": ["float32"], "flag": [True, False]}),
     ("n == 'auto' or n == 2", {"n": [2, "auto"]}),
     ("n == '2'", {"n": [None, None]}),
     ("n == 1", {"n": [[1, 2], None]}),
     ("err > '1'", {"n": [1]})],
)  # fmt: skip
def test_a_where_comparing_with_a_constant_of_a_kind_the_parameter_takes_is_valid(where, values):
    validate({"claims": [{"metric": "value", "where": where}]}, list(values), values=values)
    validate({"claims": [{"metric": "value", "where": "n == '2'"}]}, ["n"])  # values unknown


def test_planning_refuses_a_where_that_compares_a_parameter_with_another_kind(
    initialized, tmp_path
):
    cfg = compose_config(
        ["+experiment=exp014_tiled", f"out={tmp_path}", "sweep_id=S"], "exp014_tiled", []
    )
    cfg.experiment.claims = [{"metric": "sdpa_err64", "max": 1e-5, "where": "length == '128'"}]
    with pytest.raises(BadInput) as refused:
        plan(cfg, [])
    assert str(refused.value) == (
        "exp014_tiled: claim 1 (sdpa_err64): its where compares length, an integer parameter, "
        "with the text '128': write length == 128"
    )
    cfg.experiment.claims = [{"metric": "sdpa_err64", "max": 1e-5, "where": "length == 128"}]
    assert len(plan(cfg, []).points) == 9
