"""Worked solutions for arithmetic expressions, for SFT targets of tasks that ship none.

Hand-written: reasoning-gym's arithmetic tasks give the expression but no steps.
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _number(value: Fraction) -> ast.expr:
    n = int(value) if value.denominator == 1 else float(value)
    return ast.Constant(n) if n >= 0 else ast.UnaryOp(ast.USub(), ast.Constant(-n))


def _value(node: ast.expr) -> Fraction | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _value(node.operand)
        if inner is not None:
            return -inner if isinstance(node.op, ast.USub) else inner
    return None


def _reduce_once(node: ast.expr) -> ast.expr:
    """Evaluate the first binary operation (in evaluation order) whose operands are numbers."""
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left), _value(node.right)
        if left is not None and right is not None:
            return _number(_OPS[type(node.op)](left, right))
        if left is None:
            return ast.BinOp(_reduce_once(node.left), node.op, node.right)
        return ast.BinOp(node.left, node.op, _reduce_once(node.right))
    if isinstance(node, ast.UnaryOp):
        return ast.UnaryOp(node.op, _reduce_once(node.operand))
    raise ValueError(f"unsupported expression node: {ast.dump(node)}")


def arithmetic_steps(expression: str) -> str | None:
    """'3 + 4 * 2' -> '3 + 4 * 2 = 3 + 8 = 11'; None if the expression is not plain arithmetic."""
    try:
        node = ast.parse(expression.strip(), mode="eval").body
        steps = [ast.unparse(node)]
        while _value(node) is None:
            node = _reduce_once(node)
            steps.append(ast.unparse(node))
    except (SyntaxError, ValueError, KeyError, ZeroDivisionError):
        return None
    return " = ".join(steps)
