"""Safe, bounded parsing of numbers and arithmetic expressions from model text.

Nothing here evaluates text as code. Expressions are parsed by a small recursive-descent parser
over `+ - * /` and parentheses, with exact `fractions.Fraction` arithmetic, and every input is
bounded before any work is done:

  * length: at most `max_len` characters (default 256);
  * nesting: at most `max_depth` open parentheses / unary signs on the parser stack (default 32);
  * magnitude: literals at most `MAX_LITERAL_DIGITS` digits, and every intermediate value's
    numerator and denominator at most `max_bits` bits (default 256);
  * no exponentiation: `**` and `^` are syntax errors; division by zero is invalid.

Invalid input of any kind returns None; these functions do not raise on any `str`.

Unicode policy (`normalize`): text is NFKC-normalised character by character, except characters
whose compatibility decomposition is a superscript, subscript or vulgar fraction (e.g. "²", "½"),
which are kept as they are so that "3²" never reads as 32. Any remaining Unicode decimal digit
(e.g. Arabic-Indic "٣") is mapped to its ASCII digit; "−" (minus sign), "×" and "÷" become
"-", "*" and "/". Full-width digits and operators become ASCII through NFKC.

Numbers (`parse_number`): optional sign, digits with optional comma thousands groups
("12,345" but not "1,2"), optional decimal part, or a fraction "a/b" of integers. Leading "+"
is allowed; spaces inside a number are not.

Number extraction (`extract_number`): after normalisation and stripping white space, a trailing
period, and a surrounding "$...$" or "\\(...\\)", the text must either be exactly one number, or
contain exactly one number token among other text ("42 apples", "x = 42", "$1,000"). Two or more
numbers ("3 or 4", "12+7=19") are ambiguous and give None: a policy must not collect reward by
listing candidates.
"""

import fractions
import re
import unicodedata
from typing import NamedTuple, Optional

Fraction = fractions.Fraction

__all__ = ["normalize", "parse_number", "extract_number", "parse_expression", "Parsed"]

MAX_LITERAL_DIGITS = 40
MAX_TEXT_CHARS = 4096

_SKIP_DECOMPOSITIONS = ("<super>", "<sub>", "<fraction>")
_SYMBOLS = {"\u2212": "-", "\u2013": "-", "\u00d7": "*", "\u22c5": "*", "\u00b7": "*",
            "\u00f7": "/", "\u2215": "/"}
_NUMBER = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?$")
_FRACTION = re.compile(r"^([-+]?\d+)/(\d+)$")
# Superscripts, subscripts and vulgar fractions (kept by `normalize`): 3 squared is not 3.
_SCRIPTS = "\u00b2\u00b3\u00b9\u00bc-\u00be\u2070-\u209f\u2150-\u215f"
_TOKEN = re.compile(r"(?<![\d.,/^" + _SCRIPTS + r"])[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
                    r"(?:\.\d+)?(?:/\d+)?(?![\d/^" + _SCRIPTS + r"])")


def normalize(text: str) -> str:
  """NFKC-normalises `text` under the policy in the module docstring."""
  if text.isascii():
    return text
  out = []
  for ch in text:
    if ch.isascii():
      out.append(ch)
      continue
    if ch in _SYMBOLS:
      out.append(_SYMBOLS[ch])
      continue
    if unicodedata.decomposition(ch).startswith(_SKIP_DECOMPOSITIONS):
      out.append(ch)
      continue
    n = unicodedata.normalize("NFKC", ch)
    if len(n) == 1 and n.isdecimal() and not n.isascii():
      n = str(unicodedata.decimal(n))
    out.append(_SYMBOLS.get(n, n))
  return "".join(out)


def parse_number(text: str) -> Optional[Fraction]:
  """The exact value of `text` if it is one number (see module docstring), else None."""
  if not isinstance(text, str) or len(text) > 2 * MAX_LITERAL_DIGITS:
    return None
  s = normalize(text).strip()
  m = _FRACTION.match(s)
  if m:
    num, den = m.group(1), m.group(2)
    if len(num) > MAX_LITERAL_DIGITS or len(den) > MAX_LITERAL_DIGITS or int(den) == 0:
      return None
    return Fraction(int(num), int(den))
  if not _NUMBER.match(s):
    return None
  s = s.replace(",", "")
  if sum(c.isdigit() for c in s) > MAX_LITERAL_DIGITS:
    return None
  return Fraction(s)


def extract_number(text: str) -> Optional[Fraction]:
  """The single number in a short answer string, or None (see module docstring)."""
  if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
    return None
  s = normalize(text).strip()
  for left, right in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
    if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
      s = s[len(left):-len(right)].strip()
  s = s.rstrip(".").strip()
  value = parse_number(s)
  if value is not None:
    return value
  tokens = _TOKEN.findall(s)
  if len(tokens) != 1:
    return None
  return parse_number(tokens[0])


class Parsed(NamedTuple):
  """A parsed expression."""
  value: Fraction               # exact value
  numbers: tuple[int, ...]      # integer literals in order of appearance


class _Invalid(Exception):
  pass


class _Parser:
  """Recursive descent over tokens; depth-limited so Python's recursion limit is never reached.

  Grammar:  expr := term (('+'|'-') term)*      term := factor (('*'|'/') factor)*
            factor := ('+'|'-') factor | NUMBER | '(' expr ')'     (unary only if allowed)
  """

  def __init__(self, tokens, max_depth, max_bits, allow_unary):
    self.toks = tokens
    self.i = 0
    self.depth = 0
    self.max_depth = max_depth
    self.max_bits = max_bits
    self.allow_unary = allow_unary
    self.numbers = []

  def peek(self):
    return self.toks[self.i] if self.i < len(self.toks) else None

  def take(self):
    t = self.peek()
    self.i += 1
    return t

  def check(self, x: Fraction) -> Fraction:
    if x.numerator.bit_length() > self.max_bits or x.denominator.bit_length() > self.max_bits:
      raise _Invalid("magnitude")
    return x

  def expr(self) -> Fraction:
    value = self.term()
    while self.peek() in ("+", "-"):
      op = self.take()
      rhs = self.term()
      value = self.check(value + rhs if op == "+" else value - rhs)
    return value

  def term(self) -> Fraction:
    value = self.factor()
    while self.peek() in ("*", "/"):
      op = self.take()
      rhs = self.factor()
      if op == "*":
        value = self.check(value * rhs)
      else:
        if rhs == 0:
          raise _Invalid("division by zero")
        value = self.check(value / rhs)
    return value

  def enter(self):
    self.depth += 1
    if self.depth > self.max_depth:
      raise _Invalid("nesting")

  def factor(self) -> Fraction:
    t = self.take()
    if t is None:
      raise _Invalid("unexpected end")
    if t in ("+", "-"):
      if not self.allow_unary:
        raise _Invalid("unary sign")
      self.enter()
      value = self.factor()
      self.depth -= 1
      return -value if t == "-" else value
    if t == "(":
      self.enter()
      value = self.expr()
      if self.take() != ")":
        raise _Invalid("unbalanced")
      self.depth -= 1
      return value
    if isinstance(t, int):
      self.numbers.append(t)
      return Fraction(t)
    raise _Invalid(f"unexpected {t!r}")


_EXPR_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*/()]))")


def _tokenize(s: str):
  tokens, pos = [], 0
  s = s.rstrip()
  while pos < len(s):
    m = _EXPR_TOKEN.match(s, pos)
    if not m:
      raise _Invalid("bad character")
    if m.group(1) is not None:
      if len(m.group(1)) > MAX_LITERAL_DIGITS:
        raise _Invalid("literal too long")
      tokens.append(int(m.group(1)))
    else:
      op = m.group(2)
      # "**" would read as two multiplications' worth of syntax error anyway; reject it explicitly.
      if op == "*" and tokens and tokens[-1] == "*":
        raise _Invalid("exponentiation")
      tokens.append(op)
    pos = m.end()
  return tokens


def parse_expression(text: str, *, max_len: int = 256, max_depth: int = 32,
                     max_bits: int = 256, allow_unary: bool = True) -> Optional[Parsed]:
  """Parses and evaluates an integer-literal expression over `+ - * /` and parentheses.

  Args:
    text: the expression (Unicode normalised first; "×", "÷", "−" accepted).
    max_len: longest accepted text, in characters, after stripping.
    max_depth: deepest accepted nesting of parentheses and unary signs.
    max_bits: largest accepted bit length of any intermediate numerator or denominator.
    allow_unary: accept unary "+"/"-" (countdown forbids them).

  Returns:
    Parsed(value, numbers) or None for anything invalid (syntax, limits, division by zero).
  """
  if not isinstance(text, str) or len(text) > 4 * max_len:
    return None
  s = normalize(text).strip()
  if not s or len(s) > max_len:
    return None
  try:
    parser = _Parser(_tokenize(s), max_depth, max_bits, allow_unary)
    if not parser.toks:
      return None
    value = parser.expr()
    if parser.i != len(parser.toks):
      return None
    return Parsed(value, tuple(parser.numbers))
  except _Invalid:
    return None
