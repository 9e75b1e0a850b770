"""Tests for rl_curriculum/tasks/parsing.py: exact values, limits, and never raising."""

from fractions import Fraction

from hypothesis import given, settings, strategies as st
import pytest

from rl_curriculum.tasks import parsing

FUZZ = settings(max_examples=1500, deadline=None)


@pytest.mark.parametrize("text, value", [
    ("42", 42), ("-7", -7), ("+3", 3), ("1,234", 1234), ("12,345,678", 12345678),
    ("3.25", Fraction(13, 4)), ("-0.5", Fraction(-1, 2)), ("7/2", Fraction(7, 2)),
    (" 19 ", 19), ("\uff11\uff19", 19), ("\u0663\u0664", 34), ("\u2212" + "5", -5),
])
def test_parse_number_values(text, value):
  assert parsing.parse_number(text) == value


@pytest.mark.parametrize("text", [
    "", " ", "1,2", "12,34", "1 9", "19abc", "abc", "1/0", "3\u00b2", "\u00bd", "1e5", "--3",
    "1" * 41, "0x10", "inf", "nan", "1.", ".5",
])
def test_parse_number_rejects(text):
  assert parsing.parse_number(text) is None


@pytest.mark.parametrize("text, value", [
    ("42", 42), ("42.", 42), ("$42$", 42), ("42 apples", 42), ("x = 42", 42), ("$1,000", 1000),
    ("\\(5\\)", 5), ("The answer is -3", -3),
])
def test_extract_number_values(text, value):
  assert parsing.extract_number(text) == value


@pytest.mark.parametrize("text", ["3 or 4", "12+7=19", "", "none", "1, 2, 3", "3\u00b2"])
def test_extract_number_ambiguous_or_missing(text):
  assert parsing.extract_number(text) is None


@pytest.mark.parametrize("text, value, numbers", [
    ("1+2*3", 7, (1, 2, 3)), ("(1+2)*3", 9, (1, 2, 3)), ("7/2", Fraction(7, 2), (7, 2)),
    ("10-4-3", 3, (10, 4, 3)), ("8/4/2", 1, (8, 4, 2)), ("-(2-5)", 3, (2, 5)),
    (" 6 \u00d7 7 ", 42, (6, 7)), ("12\u00f74", 3, (12, 4)), ("((((3))))", 3, (3,)),
])
def test_parse_expression_values(text, value, numbers):
  parsed = parsing.parse_expression(text)
  assert parsed is not None
  assert parsed.value == value
  assert parsed.numbers == numbers


@pytest.mark.parametrize("text", [
    "2**3", "2^3", "2**999999999", "1/0", "1/(2-2)", "(1+2", "1+2)", "", "()", "1+", "*3",
    "__import__('os')", "1.5+1", "a+1", "2 3", "9" * 41,
])
def test_parse_expression_rejects(text):
  assert parsing.parse_expression(text) is None


def test_parse_expression_limits():
  assert parsing.parse_expression("(" * 32 + "1" + ")" * 32) is not None
  assert parsing.parse_expression("(" * 33 + "1" + ")" * 33) is None
  assert parsing.parse_expression("(" * 5000 + "1" + ")" * 5000) is None
  assert parsing.parse_expression("-" * 40 + "1") is None
  assert parsing.parse_expression("-1", allow_unary=False) is None
  # 2^256 overflows the default 256-bit bound; 2^255 fits.
  big = "*".join(["2"] * 256)
  assert parsing.parse_expression(big, max_len=1000) is None
  assert parsing.parse_expression("*".join(["2"] * 255), max_len=1000).value == 2 ** 255
  assert parsing.parse_expression("1+" * 200 + "1") is None  # longer than max_len


def _reference_eval(tokens):
  """Left-to-right evaluation with precedence, written independently for the fuzz check."""
  values, ops = [Fraction(tokens[0])], []
  for op, n in zip(tokens[1::2], tokens[2::2]):
    if op in "*/":
      values[-1] = values[-1] * n if op == "*" else values[-1] / n
    else:
      ops.append(op)
      values.append(Fraction(n))
  total = values[0]
  for op, v in zip(ops, values[1:]):
    total = total + v if op == "+" else total - v
  return total


@FUZZ
@given(st.lists(st.integers(1, 99), min_size=1, max_size=6), st.data())
def test_parse_expression_matches_reference(nums, data):
  ops = [data.draw(st.sampled_from("+-*/")) for _ in nums[1:]]
  tokens = [nums[0]]
  for op, n in zip(ops, nums[1:]):
    tokens += [op, n]
  text = "".join(str(t) for t in tokens)
  parsed = parsing.parse_expression(text)
  assert parsed is not None
  assert parsed.value == _reference_eval(tokens)
  assert parsed.numbers == tuple(nums)


_JUNK = st.text(alphabet="0123456789+-*/^()., \u00b2\u2212\u00d7e", max_size=80)


@FUZZ
@given(st.one_of(st.text(max_size=300), _JUNK,
                 st.builds(lambda k: "(" * k + "1" + ")" * k, st.integers(0, 3000))))
def test_parsers_never_raise(text):
  for fn in (parsing.parse_expression, parsing.parse_number, parsing.extract_number):
    out = fn(text)
    assert out is None or isinstance(out, (Fraction, parsing.Parsed))
  assert isinstance(parsing.normalize(text), str)


def test_non_string_inputs():
  for fn in (parsing.parse_expression, parsing.parse_number, parsing.extract_number):
    assert fn(None) is None
    assert fn(12) is None
