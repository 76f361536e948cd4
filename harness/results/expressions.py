"""Claims' `where` and bounds: a small expression language of the harness's own.

A claim's text comes from a sweep's manifest, which anyone who can write to outputs/ can change,
and pandas' query and eval run code (`100 + @pd.io.common.os.system(...)` runs a command). So the
harness reads these expressions itself: Python's parser turns the text into a tree (ast.parse
executes nothing), and only these constructs evaluate, over a table's columns at once:

- numbers (64, 1.0e-6), strings ('float32' or "float32"), True and False;
- column names;
- arithmetic: + - * / ** %, and unary - and +;
- comparisons: == != < <= > >=, chained as in `1 < length <= 4096`, and `in` / `not in` a list
  or tuple of constants (`dtype in ['float16', 'bfloat16']`);
- `and`, `or`, `not`, and parentheses.

Anything else (a call, an attribute, a subscript, a lambda, a comprehension...) is refused with
an ExpressionError that says what is not allowed. As in pandas' query, a comparison with a
missing value is false (and != true), and a missing truth value counts as false. Division by
zero goes as in pandas too: of constants (`1 / 0`) an ExpressionError, over a column inf or NaN on
its row (harness.results.claims makes a bound that is one an ERROR that names the row). An
expression is at most LONGEST characters (a where of hundreds of kB would take minutes over every
sweep).
"""

import ast
import functools
import operator
from dataclasses import dataclass

import pandas as pd

from harness.names import closest

ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
}
COMPARISONS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
MEMBERSHIP = (ast.In, ast.NotIn)
WRITTEN = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
           ast.In: "in", ast.NotIn: "not in"}  # fmt: skip
FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}  # 2 < n is n > 2
# Words that read as a column in a bound but mean a value, written as text: refused there.
WORDS = ("true", "false", "yes", "no", "on", "off", "none", "null", "nan", "inf", "infinity")
LONGEST = 2000  # characters; the project's longest where is under 100
SIGNS = {ast.USub: operator.neg, ast.UAdd: operator.pos}
REFUSED = {  # what the message calls a refused construct; others go by their node's name
    ast.Call: "calls",
    ast.Attribute: "attributes",
    ast.Subscript: "subscripts",
    ast.Lambda: "lambdas",
    ast.ListComp: "comprehensions",
    ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions",
    ast.GeneratorExp: "comprehensions",
    ast.IfExp: "conditional expressions",
    ast.NamedExpr: "assignments",
    ast.Starred: "starred expressions",
    ast.JoinedStr: "f-strings",
    ast.Dict: "dicts",
    ast.Set: "sets",
    ast.List: "lists (except after `in`)",
    ast.Tuple: "tuples (except after `in`)",
}


class ExpressionError(ValueError):
    """An expression outside the grammar, or one that cannot be evaluated over the table."""


@dataclass(frozen=True)
class Expression:
    """A parsed, checked expression: its text, its tree, and the column names it uses."""

    text: str
    tree: ast.expr
    names: frozenset[str]


def parse(text: str) -> Expression:
    """The expression `text`, checked against the grammar (ExpressionError if it is outside);
    cached, as the same claims are checked over many sweeps."""
    if not isinstance(text, str):
        raise ExpressionError(f"an expression is text, not {type(text).__name__}")
    if len(text) > LONGEST:
        raise ExpressionError(
            f"an expression of {len(text)} characters, over the {LONGEST} one may have: "
            f"{_quoted(text)}"
        )
    return _parse(text)


@functools.lru_cache(maxsize=1024)
def _parse(text: str) -> Expression:
    try:
        tree = ast.parse(text.strip(), mode="eval").body
        names = frozenset(_checked(tree))
    except ExpressionError:
        raise
    except SyntaxError as error:
        raise ExpressionError(f"not an expression: {_quoted(text)} ({error.msg})") from None
    except (RecursionError, MemoryError):
        raise ExpressionError(f"too deeply nested: {_quoted(text)}") from None
    except ValueError as error:  # e.g. an integer of more digits than Python converts
        raise ExpressionError(f"not an expression: {_quoted(text)} ({error})") from None
    return Expression(text, tree, names)


def evaluate(text: str, table: pd.DataFrame) -> pd.Series:
    """The expression's value for each row of `table` (a constant is repeated on every row)."""
    expression = parse(text)
    unknown = sorted(expression.names - set(table.columns))
    if unknown:
        near = closest(unknown[0], table.columns)
        raise ExpressionError(f"unknown column {unknown[0]!r} in {_quoted(text)}{near}")
    try:
        value = _value(expression.tree, table)
    except RecursionError:
        raise ExpressionError(f"too deeply nested: {_quoted(text)}") from None
    return value if isinstance(value, pd.Series) else pd.Series(value, index=table.index)


def arithmetic(text: str) -> Expression:
    """A claim's bound: a number, or arithmetic (+ - * / ** %, signs, parentheses) over numbers
    and column names (`2 * sdpa_err64 + 1e-6`). ExpressionError for anything else the grammar
    has: a comparison (`value > 3` as a bound would be a truth value, never a number), and/or/not,
    text, True or False."""
    expression = parse(text)
    offending = _not_arithmetic(expression.tree)
    if offending:
        raise ExpressionError(
            f"a bound is a number or arithmetic of numbers and columns, and {_quoted(text)} "
            f"has {offending}"
        )
    return expression


def _not_arithmetic(node: ast.expr) -> str:
    """What in a checked expression is not arithmetic, in words ("" where all of it is)."""
    match node:
        case ast.Constant(value=bool()):
            return f"the truth value {node.value}"
        case ast.Constant(value=str()):
            return f"the text {_source(node)}"
        case ast.Name() if node.id.lower() in WORDS:
            return f"the word {node.id}, which is no number (YAML's .inf is one; or leave it out)"
        case ast.Constant() | ast.Name():
            return ""
        case ast.UnaryOp(op=ast.Not()):
            return "`not`"
        case ast.UnaryOp():
            return _not_arithmetic(node.operand)
        case ast.BinOp():
            return _not_arithmetic(node.left) or _not_arithmetic(node.right)
        case ast.BoolOp():
            return f"`{'and' if isinstance(node.op, ast.And) else 'or'}`"
        case ast.Compare():
            return f"the comparison `{_source(node)}`"
    return _source(node)


def compared(expression: Expression) -> list[tuple[str, str, object]]:
    """Each column compared directly with a constant, as (column, operator, constant), in the
    order written: the column first (`2 < n` is n > 2), each constant of a list after `in` on
    its own. What a where's constants are checked against (a parameter's values) before a sweep:
    `n == '2'` where n is a number selects nothing, and says nothing."""
    found = []
    for node in sorted(_comparisons(expression.tree), key=lambda n: (n.lineno, n.col_offset)):
        left = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            written = WRITTEN[type(op)]
            if isinstance(op, MEMBERSHIP):
                constants = _constants(right) if isinstance(left, ast.Name) else []
                found += [(left.id, written, constant) for constant in constants]
            elif isinstance(left, ast.Name) and _constant(right) is not None:
                found.append((left.id, written, _constant(right)))
            elif isinstance(right, ast.Name) and _constant(left) is not None:
                found.append((right.id, FLIPPED.get(written, written), _constant(left)))
            left = right
    return found


def _comparisons(node: ast.expr) -> list[ast.Compare]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Compare)]


def _constant(node: ast.expr):
    """The constant a node writes (-2 too), None where it is no constant."""
    match node:
        case ast.Constant(value=bool() | int() | float() | str()):
            return node.value
        case ast.UnaryOp(op=ast.USub() | ast.UAdd(), operand=ast.Constant(value=int() | float())):
            if not isinstance(node.operand.value, bool):
                return SIGNS[type(node.op)](node.operand.value)
    return None


def holds(condition: str, table: pd.DataFrame, what: str = "a where") -> pd.Series:
    """Whether the condition holds on each row of `table`, missing as false (ExpressionError,
    naming it `what`, if it gives something other than true or false)."""
    said = f"{what} must be true or false: {_quoted(condition)}"
    value = _truth(evaluate(condition, table), said)
    return value if isinstance(value, pd.Series) else pd.Series(value, index=table.index)


def select(table: pd.DataFrame, where: str) -> pd.DataFrame:
    """The rows of `table` where the condition `where` holds."""
    return table[holds(where, table).to_numpy()]


def _checked(node: ast.expr) -> set[str]:
    """The column names `node` uses; ExpressionError at the first construct outside the grammar."""
    match node:
        case ast.Constant(value=bool() | int() | float() | str()):
            return set()
        case ast.Name():
            return {node.id}
        case ast.UnaryOp(op=ast.Not() | ast.USub() | ast.UAdd()):
            return _checked(node.operand)
        case ast.BinOp() if type(node.op) in ARITHMETIC:
            return _checked(node.left) | _checked(node.right)
        case ast.BoolOp():
            return set().union(*map(_checked, node.values))
        case ast.Compare():
            names = _checked(node.left)
            for op, right in zip(node.ops, node.comparators, strict=True):
                if isinstance(op, MEMBERSHIP):
                    _constants(right)
                elif type(op) in COMPARISONS:
                    names |= _checked(right)
                else:
                    raise ExpressionError(f"the comparison `{_symbol(op)}` is not allowed")
            return names
        case ast.Constant():
            raise ExpressionError(f"the constant {_source(node)} is not allowed")
        case ast.UnaryOp() | ast.BinOp():
            raise ExpressionError(f"the operator `{_symbol(node.op)}` is not allowed")
    what = REFUSED.get(type(node), f"{type(node).__name__} expressions")
    raise ExpressionError(f"{what} are not allowed: {_source(node)}")


def _constants(node: ast.expr) -> list:
    """The values of a list or tuple of constants (after `in`); ExpressionError otherwise."""
    if not isinstance(node, ast.List | ast.Tuple):
        raise ExpressionError(f"`in` takes a list of constants, not {_source(node)}")
    try:
        values = [ast.literal_eval(element) for element in node.elts]
    except ValueError:
        raise ExpressionError(f"`in` takes a list of constants, not {_source(node)}") from None
    if not all(isinstance(v, bool | int | float | str) for v in values):
        raise ExpressionError(f"`in` takes numbers, strings, True or False: {_source(node)}")
    return values


def _value(node: ast.expr, table: pd.DataFrame):
    """The value of a checked expression over `table`: a Series, or a constant."""
    match node:
        case ast.Constant():
            return node.value
        case ast.Name():
            return table[node.id]
        case ast.UnaryOp(op=ast.Not()):
            return _not(_truth(_value(node.operand, table), _words("not", node.operand)))
        case ast.UnaryOp():
            return SIGNS[type(node.op)](_number(_value(node.operand, table), node.operand))
        case ast.BinOp():
            return _arithmetic(node, _value(node.left, table), _value(node.right, table))
        case ast.BoolOp():
            word = "and" if isinstance(node.op, ast.And) else "or"
            join = operator.and_ if word == "and" else operator.or_
            values = [_truth(_value(v, table), _words(word, v)) for v in node.values]
            return functools.reduce(join, values)
        case ast.Compare():
            return _compare(node, table)
    raise ExpressionError(f"cannot evaluate {_source(node)}")  # parse refused it already


def _arithmetic(node: ast.BinOp, left, right):
    """left op right, over numbers only; ** in floating point (no huge integers)."""
    left, right = _number(left, node.left), _number(right, node.right)
    try:
        if isinstance(node.op, ast.Pow):
            left, right = _float(left), _float(right)
        return ARITHMETIC[type(node.op)](left, right)
    except (ArithmeticError, TypeError, ValueError) as error:
        raise ExpressionError(f"cannot compute {_source(node)}: {error}") from None


def _compare(node: ast.Compare, table: pd.DataFrame):
    """A comparison, chained ones true where every link is."""
    left, result = _value(node.left, table), True
    for op, right_node in zip(node.ops, node.comparators, strict=True):
        if isinstance(op, MEMBERSHIP):
            right = _constants(right_node)
            found = left.isin(right) if isinstance(left, pd.Series) else left in right
            link = _not(found) if isinstance(op, ast.NotIn) else found
        else:
            right = _value(right_node, table)
            try:
                link = COMPARISONS[type(op)](left, right)
            except TypeError as error:
                raise ExpressionError(f"cannot compare {_source(node)}: {error}") from None
        result = result & link
        left = right
    return result


def _truth(value, message: str):
    """A truth value, or a Series of them (missing ones false); ExpressionError otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, pd.Series):
        if pd.api.types.is_bool_dtype(value):
            return value.fillna(False).astype(bool)
        known = value.dropna()
        if known.map(pd.api.types.is_bool).all():
            return value.where(value.notna(), False).astype(bool)  # booleans, some missing
    raise ExpressionError(message)


def _not(value):
    return ~value if isinstance(value, pd.Series) else not value


def _number(value, node: ast.expr):
    """A number, or a Series of numbers; ExpressionError for text."""
    if isinstance(value, pd.Series):
        if pd.api.types.is_numeric_dtype(value):
            return value
        try:
            return pd.to_numeric(value)  # numbers held as objects (some missing)
        except (TypeError, ValueError):
            pass
    elif isinstance(value, int | float):
        return value
    raise ExpressionError(f"arithmetic takes numbers, and {_source(node)} is not one")


def _float(value):
    return value.astype(float) if isinstance(value, pd.Series) else float(value)


def _words(word: str, node: ast.expr) -> str:
    return f"`{word}` takes true or false, and {_source(node)} is neither"


def _source(node: ast.AST) -> str:
    """The node as text, on one line and short; a call's arguments as `(...)`."""
    if isinstance(node, ast.Call):
        return f"{_source(node.func)}(...)"
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _quoted(text: str) -> str:
    """The text quoted, on one line and short."""
    return repr(text) if len(text) <= 60 else repr(text[:57] + "...")


def _symbol(op: ast.AST) -> str:
    symbols = {ast.FloorDiv: "//", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|",
               ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>", ast.Invert: "~",
               ast.Is: "is", ast.IsNot: "is not"}  # fmt: skip
    return symbols.get(type(op), type(op).__name__)
