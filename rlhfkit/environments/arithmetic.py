"""The safe calculator behind GSM8K's calculator annotations (Cobbe et al. 2021).

GSM8K solutions write a computation as ``<<48/2=24>>24``: the policy emits ``<<expression=`` and the
environment supplies the result. ``calculate("48/2")`` returns ``"24"``.

What it accepts: ASCII digits, ``.``, ``+ - * /``, parentheses and spaces; decimal literals such as ``12``,
``0.5``, ``.5`` and ``3.``; unary ``-``/``+`` (so ``--1`` is 1). As a multiplication sign it also takes
``×`` anywhere and ``x`` with a space on each side (``3 x 4``); a glued ``x`` (``3x4``) is refused as a
letter, because ``0x10`` would read as a product where Python reads hexadecimal. Everything else is
refused with :class:`Refused`: letters, ``_``, quotes, brackets, commas (``1,000`` could be a thousands
separator or a tuple, and no annotation inside ``<<...>>`` in GSM8K's training split has one), ``**``,
``//``, ``%``, ``^``, exponent notation, hexadecimal, ``1_000`` and non-ASCII digits.

Why no ``eval``: the expression is written by the policy being trained, so it is hostile input.
``eval`` of it (even with empty builtins) reaches ``().__class__.__subclasses__()``, and an innocent
``9**9**9`` hangs the worker. Instead the raw text passes a length limit and a character whitelist
*before* any parsing, then ``ast.parse(mode="eval")`` gives a tree that is checked against a node
whitelist and evaluated by hand on exact ``Fraction`` values (each literal from its source text, so
``0.1`` is exactly 1/10, not the float nearest it).

Limits: at most MAX_CHARACTERS (64) characters, tree depth at most 20, at most 64 expression nodes (a
backstop: every node takes at least one character), at most 15 digits per literal, and every value met
on the way with numerator and denominator below 10**18. Division by zero is refused. Each refusal takes
well under a millisecond.

Results print as an integer when integral, else rounded half away from zero to 4 decimal places with
trailing zeros trimmed ("0.2", "3.3333").

Reproduction on GSM8K's training split (7,473 solutions, 23,716 annotations ``<<lhs=rhs>>``, measured
by tests/environments/test_arithmetic.py): 23,714 left-hand sides evaluate; the 2 refused use floor division
(``560//10``, ``180//3``), which stays refused (``//`` truncates silently; plain ``/`` covers both).
All 23,714 equal ``Fraction(rhs)`` exactly: the writers never rounded. ``format_number`` reproduces the
written rhs for 23,047 of 23,716 (97.18%); the 667 misses are all the same value in other text: 589
written with trailing zeros (``144.00``, ``4.80``) and 78 without the leading zero (``.5``). So the
number of places does not matter here (3, 4 or more places reproduce 23,047, 2 places 23,046); 4 are
kept to keep more of a non-terminating result.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction

MAX_CHARACTERS = 64
MAX_DEPTH = 20
MAX_NODES = 64
MAX_DIGITS = 15  # per literal: a 15-digit literal is far below the 10**18 bound
BOUND = 10**18  # |numerator| and |denominator| of every value stay below it
PLACES = 4  # decimal places of a non-integral result

ALLOWED_CHARACTERS = frozenset("0123456789.+-*/() ")
# ` x ` (spaces both sides) is a multiplication sign; a glued x stays a letter (0x10 is hexadecimal).
SPACED_X = re.compile(r"(?<= )x(?= )")

BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: _divide(a, b),
}
UNARY = {ast.USub: lambda a: -a, ast.UAdd: lambda a: a}


class Refused(ValueError):
    """An expression the calculator will not evaluate; the message says why in one short line."""


def calculate(expression: str) -> str:
    """The annotation's result as GSM8K writes it: ``calculate("48/2") == "24"``."""
    return format_number(evaluate(expression))


def evaluate(expression: str) -> Fraction:
    """The exact value of `expression`, or Refused."""
    text = _precheck(expression)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:  # "1+", "1.2.3", leading zeros ("05")
        raise Refused(f"not an expression: {e.msg.split(';')[0]}") from None  # Python's advice cut off
    _check_tree(tree)
    return _value(tree.body, text)


def format_number(value: Fraction) -> str:
    """An integer if `value` is integral, else a decimal rounded to PLACES places (half away from zero, as a
    person would: 1/32 is "0.0313"), trailing zeros trimmed: "24", "-5", "0.2", "3.3333"."""
    if value.denominator == 1:
        return str(value.numerator)
    units = int(abs(value) * 10**PLACES + Fraction(1, 2))  # rounded half away from zero, exactly (no float)
    whole, fraction = divmod(units, 10**PLACES)
    sign = "-" if value < 0 and units else ""  # a negative value that rounds to zero prints "0", not "-0"
    # the dot stops the trimming: "5.0000" becomes "5", "10.5000" "10.5", and an integer keeps its zeros
    return f"{sign}{whole}.{fraction:0{PLACES}d}".rstrip("0").rstrip(".")


# ---------------------------------------------------------------- before parsing


def _precheck(expression: str) -> str:
    """The text to parse, after the checks that need no parser (so hostile text never reaches it)."""
    if len(expression) > MAX_CHARACTERS:  # first: a 10,000-character input costs nothing more
        raise Refused(f"too long: {len(expression)} characters (at most {MAX_CHARACTERS})")
    text = SPACED_X.sub("*", expression.replace("×", "*"))
    for character in text:
        if character not in ALLOWED_CHARACTERS:
            raise Refused(f"not arithmetic: character {character!r}")
    if "**" in text:
        raise Refused("not arithmetic: no power (**)")
    text = text.strip()  # a leading space is an indentation error to the parser
    if not text:
        raise Refused("empty expression")
    return text


# ---------------------------------------------------------------- the tree


def _check_tree(tree: ast.Expression) -> None:
    """Refuse any node outside the whitelist, and trees too deep or too large, before computing anything."""
    nodes = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            if type(node.op) not in BINARY:
                raise Refused(f"not arithmetic: {type(node.op).__name__}")
        elif isinstance(node, ast.UnaryOp):
            if type(node.op) not in UNARY:
                raise Refused(f"not arithmetic: {type(node.op).__name__}")
        elif isinstance(node, ast.Constant):
            # bool is an int subclass; Ellipsis ("...") and strings are constants too
            if type(node.value) not in (int, float):
                raise Refused(f"not arithmetic: {type(node.value).__name__} constant")
        elif not isinstance(node, (ast.Expression, ast.operator, ast.unaryop)):
            raise Refused(f"not arithmetic: {type(node).__name__}")
        if isinstance(node, ast.expr):  # operands and operations; the operator tokens are not counted
            nodes += 1
    if nodes > MAX_NODES:
        raise Refused(f"too many nodes: {nodes} (at most {MAX_NODES})")
    if _depth(tree.body) > MAX_DEPTH:
        raise Refused(f"too deep: more than {MAX_DEPTH} levels")


def _depth(node: ast.expr) -> int:
    """Levels of the (already whitelisted) tree; recursion is safe, the length limit keeps it shallow."""
    if isinstance(node, ast.BinOp):
        return 1 + max(_depth(node.left), _depth(node.right))
    if isinstance(node, ast.UnaryOp):
        return 1 + _depth(node.operand)
    return 1


def _value(node: ast.expr, text: str) -> Fraction:
    """The exact value of a checked node, every step bounded."""
    if isinstance(node, ast.Constant):
        return _bounded(_literal(node, text))
    if isinstance(node, ast.UnaryOp):
        return UNARY[type(node.op)](_value(node.operand, text))
    left, right = _value(node.left, text), _value(node.right, text)
    return _bounded(BINARY[type(node.op)](left, right))


def _literal(node: ast.Constant, text: str) -> Fraction:
    """The literal read from its source text, so 0.1 is exactly 1/10 (the float 0.1 is not)."""
    source = ast.get_source_segment(text, node)
    digits = sum(character.isdigit() for character in source)
    if digits > MAX_DIGITS:
        raise Refused(f"number too long: {digits} digits (at most {MAX_DIGITS})")
    return Fraction(source)  # the whitelist left only ASCII digits and one "."


def _divide(a: Fraction, b: Fraction) -> Fraction:
    if b == 0:
        raise Refused("division by zero")
    return a / b


def _bounded(value: Fraction) -> Fraction:
    """Refuse a value whose numerator or denominator reaches 10**18 (keeps every step cheap)."""
    if abs(value.numerator) >= BOUND or value.denominator >= BOUND:
        raise Refused("number too large: beyond 10**18")
    return value
