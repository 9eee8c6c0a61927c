"""calculator: exact results, whitelisted syntax only, bounded sizes."""

from __future__ import annotations

import time

import pytest

from tools.base import InvalidArgumentsError, ToolContext
from tools.builtin.calculator import CalculatorTool
from tools.registry import ToolRegistry


def calc(ctx: ToolContext, expr: str) -> dict:
    return ToolRegistry([CalculatorTool()]).execute("calculator", {"expression": expr}, ctx).content


@pytest.mark.parametrize(
    ("expr", "value", "decimal"),
    [
        ("0.1 + 0.2", "3/10", "0.3"),
        ("1/3", "1/3", "0.33333333333333333333333333333333333333333333333333"),
        ("2 ** 100", "1267650600228229401496703205376", "1267650600228229401496703205376"),
        ("7 // 2", "3", "3"),
        ("-7 % 3", "2", "2"),
        ("(1 + 2) * -3", "-9", "-9"),
        ("4 ** 0.5", "2", "2"),
        ("(8/27) ** (1/3)", "2/3", "0.66666666666666666666666666666666666666666666666667"),
        ("2 ** -2", "1/4", "0.25"),
        ("1e-3 * 1_000", "1", "1"),
        ("1.5e2", "150", "150"),
    ],
)
def test_exact_results(ctx: ToolContext, expr: str, value: str, decimal: str) -> None:
    out = calc(ctx, expr)
    assert out["value"] == value
    assert out["decimal"] == decimal
    assert out["is_integer"] == ("/" not in value)


@pytest.mark.parametrize(
    ("expr", "needle"),
    [
        ("__import__('os').system('id')", "Call is not allowed"),
        ("().__class__", "Attribute is not allowed"),
        ("x + 1", "Name is not allowed"),
        ("[1, 2]", "List is not allowed"),
        ("1 if 1 else 2", "IfExp is not allowed"),
        ("1 << 100", "LShift is not allowed"),
        ("~1", "Invert is not allowed"),
        ("1 < 2", "Compare is not allowed"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1j", "only numbers"),
        ("lambda: 1", "Lambda is not allowed"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "zero cannot be raised"),
        ("2 ** 0.5", "irrational"),
        ("(-8) ** (1/3)", "non-negative"),
        ("1 +", "cannot parse"),
        pytest.param("(" * 400 + "1" + ")" * 400, "nested", id="deep-parens"),
        pytest.param("-" * 1500 + "1", "syntax nodes|nested too deeply|parse", id="deep-unary"),
    ],
)
def test_refused(ctx: ToolContext, expr: str, needle: str) -> None:
    with pytest.raises(InvalidArgumentsError, match=needle):
        calc(ctx, expr)


@pytest.mark.parametrize(
    "expr",
    [
        "9 ** 9 ** 9",
        "10 ** 100000",
        "2 ** 30000",
        "1e100000000",
        "(10 ** 3000) * (10 ** 3000) * (10 ** 3000)",
    ],
)
def test_huge_results_refused_quickly(ctx: ToolContext, expr: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(InvalidArgumentsError, match=r"too large|out of range"):
        calc(ctx, expr)
    assert time.monotonic() - t0 < 2.0  # refused before computing, not after


def test_long_expression_refused_by_schema(ctx: ToolContext) -> None:
    with pytest.raises(InvalidArgumentsError):
        calc(ctx, "1+" * 1500 + "1")
