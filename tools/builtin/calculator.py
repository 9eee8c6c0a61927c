"""`calculator`: exact rational arithmetic over a whitelisted AST (no `eval`).

Numbers are ints or exact fractions: a decimal literal such as 0.1 is the fraction 1/10, so
0.1 + 0.2 is exactly 3/10. Sizes are bounded before each operation is carried out, so
`9**9**9` or `10**100000 * 10**100000` is refused instead of eating the CPU.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from decimal import Context, Decimal
from fractions import Fraction
from typing import Any

from tools.base import (
    InvalidArgumentsError,
    PermanentToolError,
    RetryPolicy,
    ToolContext,
    ToolResult,
    ToolSpec,
)

MAX_EXPRESSION_CHARS = 2000
MAX_NODES = 500
MAX_BITS = 20_000  # numerator or denominator of any intermediate value (~6,000 decimal digits)
MAX_EXPONENT = 10_000
DECIMAL_DIGITS = 50


_ALLOWED_NODES = (
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.Constant,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.FloorDiv,
    ast.Mod,
    ast.Pow,
    ast.UAdd,
    ast.USub,
)


class CalculatorError(InvalidArgumentsError):
    """The expression is not something the calculator will evaluate (the model should fix it)."""


def _check_size(value: Fraction) -> Fraction:
    if value.numerator.bit_length() > MAX_BITS or value.denominator.bit_length() > MAX_BITS:
        raise CalculatorError(f"result is too large (limit {MAX_BITS} bits per numerator/denominator)")
    return value


def _exact_root(n: int, k: int) -> int | None:
    """The integer k-th root of n >= 0 when it is exact, else None."""
    if n < 2:
        return n
    r = 1 << -(-n.bit_length() // k)  # an upper bound, then Newton downwards
    while True:
        s = ((k - 1) * r + n // r ** (k - 1)) // k
        if s >= r:
            break
        r = s
    return r if r**k == n else None


def _pow(base: Fraction, exp: Fraction) -> Fraction:
    if exp.denominator != 1:
        # Rational exponent p/q: allowed only when the q-th root is exact (4 ** 0.5 == 2).
        if exp.denominator > 64 or base < 0:
            raise CalculatorError("fractional powers are only exact for non-negative bases and small roots")
        num = _exact_root(base.numerator, exp.denominator)
        den = _exact_root(base.denominator, exp.denominator)
        if num is None or den is None:
            raise CalculatorError(f"{base} ** {exp} is irrational; the calculator is exact only")
        base, exp = Fraction(num, den), Fraction(exp.numerator)
    e = int(exp)
    if abs(e) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {e} is out of range (|exponent| <= {MAX_EXPONENT})")
    if base == 0 and e < 0:
        raise CalculatorError("zero cannot be raised to a negative power")
    bits = max(base.numerator.bit_length(), base.denominator.bit_length())
    if bits > 1 and bits * abs(e) > MAX_BITS:  # refuse before computing, not after
        raise CalculatorError(f"result is too large (limit {MAX_BITS} bits)")
    return base**e


def _binop(op: ast.operator, a: Fraction, b: Fraction) -> Fraction:
    if isinstance(op, ast.Add):
        return a + b
    if isinstance(op, ast.Sub):
        return a - b
    if isinstance(op, ast.Mult):
        return a * b
    if isinstance(op, ast.Pow):
        return _pow(a, b)
    if b == 0:
        raise CalculatorError("division by zero")
    if isinstance(op, ast.Div):
        return a / b
    if isinstance(op, ast.FloorDiv):
        return Fraction(a // b)
    if isinstance(op, ast.Mod):
        return a % b
    raise CalculatorError(f"operator {type(op).__name__} is not allowed")


def _literal(value: object, source: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalculatorError(f"only numbers are allowed, got {type(value).__name__}")
    if isinstance(value, int):
        return Fraction(value)
    # Take the decimal text the model wrote, not the binary float: 0.1 is exactly 1/10.
    try:
        dec = Decimal(source.replace("_", ""))
    except ArithmeticError:
        raise CalculatorError(f"cannot read the number {source!r}") from None
    if not dec.is_finite() or abs(dec.adjusted()) > MAX_EXPONENT:  # 1e100000000 is refused unbuilt
        raise CalculatorError(f"the number {source!r} is out of range")
    return Fraction(dec)


def evaluate(expression: str) -> Fraction:
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise CalculatorError(f"cannot parse the expression: {type(exc).__name__}: {exc}") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise CalculatorError(f"expression has more than {MAX_NODES} syntax nodes")
    for node in nodes:
        if not isinstance(node, _ALLOWED_NODES):
            raise CalculatorError(
                f"{type(node).__name__} is not allowed: use numbers, parentheses and + - * / // % **"
            )

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return _check_size(_literal(node.value, ast.get_source_segment(expression.strip(), node) or ""))
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            return _check_size(_binop(node.op, ev(node.left), ev(node.right)))
        raise CalculatorError(f"{type(node).__name__} is not allowed")

    try:
        return ev(tree)
    except RecursionError:
        raise CalculatorError("expression is nested too deeply") from None


def to_decimal(value: Fraction, digits: int = DECIMAL_DIGITS) -> str:
    ctx = Context(prec=digits)
    return str(ctx.divide(Decimal(value.numerator), Decimal(value.denominator)))


class CalculatorTool:
    spec = ToolSpec(
        name="calculator",
        description=(
            "Exact arithmetic. Numbers are integers or decimals (taken exactly: 0.1 is 1/10); "
            "operators + - * / // % ** and parentheses. Returns the exact value (an integer or a "
            "fraction p/q) and a decimal rendering to 50 significant digits."
        ),
        parameters={
            "type": "object",
            "properties": {
                "expression": {"type": "string", "minLength": 1, "maxLength": MAX_EXPRESSION_CHARS},
            },
            "required": ["expression"],
            "additionalProperties": False,
        },
        result_schema={
            "type": "object",
            "properties": {
                "value": {"type": "string", "description": "exact: an integer or p/q"},
                "decimal": {"type": "string"},
                "is_integer": {"type": "boolean"},
            },
            "required": ["value", "decimal", "is_integer"],
        },
        retry=RetryPolicy(
            max_attempts=1, timeout_s=5.0, retry_on_timeout=False
        ),  # pure: a retry gives the same
        idempotent=True,
        resources=(),
        max_argument_bytes=4 * 1024,
    )

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        try:
            value = evaluate(arguments["expression"])
        except CalculatorError:
            raise
        except (ArithmeticError, ValueError) as exc:  # e.g. a modulo of huge fractions
            raise PermanentToolError(f"cannot evaluate: {exc}") from None
        exact = str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
        return ToolResult(
            content={"value": exact, "decimal": to_decimal(value), "is_integer": value.denominator == 1}
        )


__all__ = ["CalculatorError", "CalculatorTool", "evaluate"]
