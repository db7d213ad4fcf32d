"""The grammar of the strings fbands accepts: generator expressions and divergence specs.

Strings from users and configs are data.  This module turns them into sympy objects with a
small recursive-descent parser; nothing in it (or in sympy behind it) evaluates text as
Python.  Two entry points:

* :func:`parse_expression`: an arithmetic expression over the names a caller allows, such as
  ``"(u - 1)**2 / (u + 1)"`` or ``"u**a - 1 - a*(u - 1)"``;
* :func:`parse_spec`: a divergence spec, a name with optional numeric arguments, such as
  ``"kl"``, ``"alpha(0.5)"`` or ``"alpha(a=-1/2)"``.

The grammar (``^`` is accepted for ``**``; ``-u**2`` is ``-(u**2)``)::

    expr   := term (("+" | "-") term)*
    term   := unary (("*" | "/") unary)*
    unary  := ("+" | "-") unary | power
    power  := atom (("**" | "^") unary)?
    atom   := NUMBER | NAME | FUNCTION "(" expr ")" | "(" expr ")"
    spec   := NAME ("(" (arg ("," arg)*)? ")")?
    arg    := (NAME "=")? expr            (an expr of numbers only)

Numbers are read exactly (``0.1`` is 1/10).  The size of what may be written is bounded
(:data:`MAX_LENGTH`, :data:`MAX_DEPTH`, :data:`MAX_EXPONENT`), so that no string can make
the parser, or the exact arithmetic it asks of sympy, run for long.  Sympy expressions given
directly (not as text) are checked against the same vocabulary by :func:`check_nodes`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sympy as sp

from fbands.errors import DivergenceError

__all__ = ["FUNCTIONS", "check_nodes", "number", "parse_expression", "parse_number", "parse_spec"]

#: The functions an expression may call, by the name it uses.
FUNCTIONS = {
    "exp": sp.exp,
    "log": sp.log,
    "sqrt": sp.sqrt,
    "abs": sp.Abs,
    "sinh": sp.sinh,
    "cosh": sp.cosh,
}
#: Longest string accepted: a generator is a line, not a program.
MAX_LENGTH = 500
#: Deepest nesting of parentheses, unary signs and powers (keeps recursion shallow).
MAX_DEPTH = 40
#: Largest magnitude of a number in an exponent, and of a numerator or denominator there:
#: ``u**1000`` is still cheap for sympy, ``10**10**10`` would never finish.
MAX_EXPONENT = 1000
#: Largest magnitude of a number literal: beyond it the band is no longer a float64 question.
MAX_LITERAL = sp.Integer(10) ** 300

_TOKEN = re.compile(
    r"\s*(?:(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>\*\*|[-+*/^(),=]))"
)


@dataclass(frozen=True)
class _Token:
    kind: str  # "number", "name", "op" or "end"
    text: str
    pos: int


def _tokens(text: str) -> list[_Token]:
    if not isinstance(text, str):
        raise DivergenceError(f"expected a string, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise DivergenceError(f"expression longer than {MAX_LENGTH} characters")
    out, pos = [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            out.append(_Token("end", "", pos))
            return out
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise DivergenceError(f"unexpected character {text[pos]!r} at position {pos} "
                                  f"in {text!r}")
        kind = m.lastgroup
        out.append(_Token(kind, m.group(kind), m.start(kind)))
        pos = m.end()


class _Parser:
    def __init__(self, text: str, names: dict[str, sp.Expr]):
        self.text = text
        self.names = names
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0

    # -- helpers

    def peek(self) -> _Token:
        return self.toks[self.i]

    def take(self) -> _Token:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def error(self, what: str, tok: _Token | None = None) -> DivergenceError:
        tok = tok or self.peek()
        found = "the end" if tok.kind == "end" else repr(tok.text)
        return DivergenceError(f"{what} at position {tok.pos} of {self.text!r} (found {found})")

    def expect(self, op: str) -> None:
        tok = self.peek()
        if tok.kind != "op" or tok.text != op:
            raise self.error(f"expected {op!r}")
        self.i += 1

    def at(self, *ops: str) -> bool:
        tok = self.peek()
        return tok.kind == "op" and tok.text in ops

    def nested(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"expression nested deeper than {MAX_DEPTH}")

    # -- the grammar

    def expr(self) -> sp.Expr:
        self.nested()
        out = self.term()
        while self.at("+", "-"):
            op = self.take().text
            rhs = self.term()
            out = out + rhs if op == "+" else out - rhs
        self.depth -= 1
        return out

    def term(self) -> sp.Expr:
        out = self.unary()
        while self.at("*", "/"):
            tok = self.take()
            rhs = self.unary()
            if tok.text == "/":
                if rhs == 0:
                    raise self.error("division by zero", tok)
                out = out / rhs
            else:
                out = out * rhs
        return out

    def unary(self) -> sp.Expr:
        if self.at("+", "-"):
            self.nested()
            sign = self.take().text
            value = self.unary()
            self.depth -= 1
            return -value if sign == "-" else value
        return self.power()

    def power(self) -> sp.Expr:
        base = self.atom()
        if self.at("**", "^"):
            tok = self.take()
            self.nested()
            exponent = self.unary()
            self.depth -= 1
            return _power(base, exponent, lambda what: self.error(what, tok))
        return base

    def atom(self) -> sp.Expr:
        tok = self.take()
        if tok.kind == "number":
            return number(tok.text)
        if tok.kind == "name":
            if tok.text in FUNCTIONS and self.at("("):
                self.expect("(")
                arg = self.expr()
                self.expect(")")
                return FUNCTIONS[tok.text](arg)
            if tok.text in self.names:
                return self.names[tok.text]
            allowed = sorted(self.names)
            raise self.error(
                f"unknown name {tok.text!r} (allowed: functions {sorted(FUNCTIONS)}"
                + (f", variables {allowed}" if allowed else ", no variables") + ")",
                tok,
            )
        if tok.kind == "op" and tok.text == "(":
            value = self.expr()
            self.expect(")")
            return value
        self.i -= 1
        raise self.error("expected a number, a name or '('")


def number(text: str) -> sp.Rational:
    """A decimal literal as an exact rational (``"0.1"`` is 1/10, ``"1e-3"`` is 1/1000)."""
    mantissa, _, exponent = text.lower().partition("e")
    if exponent and abs(int(exponent)) > 400:
        raise DivergenceError(f"number {text!r} is out of range")
    value = sp.Rational(mantissa) * sp.Integer(10) ** int(exponent or 0)
    if abs(value) > MAX_LITERAL:
        raise DivergenceError(f"number {text!r} is out of range (at most 1e300)")
    return value


def _power(base: sp.Expr, exponent: sp.Expr, error) -> sp.Expr:
    if exponent.is_number:
        if not exponent.is_Rational:
            raise error("an exponent must be a rational number or an expression in the "
                        "variables")
        if abs(exponent) > MAX_EXPONENT or exponent.q > MAX_EXPONENT:
            raise error(f"exponent {exponent} is too large (at most {MAX_EXPONENT} in "
                        f"magnitude, with a denominator of at most {MAX_EXPONENT})")
        if base == 0 and exponent <= 0:
            raise error("0 to a non-positive power")
        if base.is_Rational:  # sympy computes it exactly: bound the digits it would take
            digits = len(str(abs(base.p))) + len(str(base.q))
            if digits * abs(exponent) > 2000:
                raise error(f"a power of about {digits * abs(exponent)} digits is too large")
    elif base.is_number:
        raise error("a number raised to a variable power; write exp(...) instead")
    return base**exponent


def parse_expression(text: str, names: dict[str, sp.Expr]) -> sp.Expr:
    """Parse ``text`` (see the module docstring) with ``names`` as its only variables.

    Raises :class:`fbands.DivergenceError` naming the position of the first error.

    >>> import sympy as sp
    >>> u = sp.Symbol("u", positive=True)
    >>> parse_expression("(u - 1)^2 / (u + 1)", {"u": u})
    (u - 1)**2/(u + 1)
    >>> parse_expression("__import__('os')", {"u": u})
    Traceback (most recent call last):
    ...
    fbands.errors.DivergenceError: unknown name '__import__' ...
    """
    p = _Parser(text, names)
    if p.peek().kind == "end":
        raise DivergenceError("empty expression")
    value = p.expr()
    if p.peek().kind != "end":
        raise p.error("expected an operator or the end")
    check_nodes(value, names.values())
    return value


def parse_number(text: str) -> sp.Rational:
    """A numeric expression without variables (``"1/2"``, ``"-1e-3"``, ``"2**-3"``), exact."""
    value = parse_expression(text, {})
    if not value.is_Rational:
        raise DivergenceError(f"{text!r} is not a rational number (it is {value})")
    return value


def parse_spec(text: str) -> tuple[str, list[sp.Rational], dict[str, sp.Rational]]:
    """Split a divergence spec into its name, positional and keyword numeric arguments.

    >>> parse_spec("alpha(a=1/2)")
    ('alpha', [], {'a': 1/2})
    >>> parse_spec(" kl ")
    ('kl', [], {})
    """
    p = _Parser(text, {})
    tok = p.take()
    if tok.kind != "name":
        raise p.error("a divergence spec starts with a name", tok)
    name, args, kwargs = tok.text, [], {}
    if p.at("("):
        p.take()
        while not p.at(")"):
            if args or kwargs:
                p.expect(",")
            key = None
            if p.peek().kind == "name" and p.toks[p.i + 1].text == "=":
                key = p.take().text
                p.take()
                if key in kwargs:
                    raise p.error(f"argument {key!r} given twice")
            elif kwargs:
                raise p.error("a positional argument after a keyword argument")
            start = p.peek()
            value = p.expr()
            if not value.is_Rational:
                raise p.error("an argument must be a rational number", start)
            if key is None:
                args.append(value)
            else:
                kwargs[key] = value
        p.expect(")")
    if p.peek().kind != "end":
        raise p.error("expected the end of the spec")
    return name, args, kwargs


#: The sympy node types a generator may contain (what the backends' code printer knows).
_NODES = (sp.Symbol, sp.Rational, sp.Float, sp.Add, sp.Mul, sp.Pow, sp.exp, sp.log, sp.Abs,
          sp.sinh, sp.cosh, sp.core.numbers.NumberSymbol)


def check_nodes(expr: sp.Expr, symbols=()) -> None:
    """Raise :class:`fbands.DivergenceError` unless ``expr`` is built from :data:`FUNCTIONS`,
    arithmetic, real finite numbers and the given ``symbols`` only."""
    allowed = set(symbols)
    if not isinstance(expr, sp.Expr):
        raise DivergenceError(f"expected a sympy expression, got {type(expr).__name__}")
    for node in sp.preorder_traversal(expr):
        if node.is_number and not (node.is_real and node.is_finite):
            raise DivergenceError(f"{node} in {expr} is not a finite real number")
        if not isinstance(node, _NODES):
            raise DivergenceError(
                f"unsupported {type(node).__name__} in {expr}; a generator may use "
                f"+ - * / ** and {sorted(FUNCTIONS)}"
            )
        if isinstance(node, sp.Pow) and node.exp.is_number and (
            abs(node.exp) > MAX_EXPONENT or (node.exp.is_Rational and node.exp.q > MAX_EXPONENT)
        ):
            raise DivergenceError(f"exponent {node.exp} in {expr} is too large (at most "
                                  f"{MAX_EXPONENT} in magnitude, denominator at most "
                                  f"{MAX_EXPONENT})")
        if isinstance(node, sp.Symbol) and allowed and node not in allowed:
            raise DivergenceError(f"unknown symbol {node} in {expr}")
