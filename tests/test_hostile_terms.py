"""Hostile term text and terms (issue 28): text is bounded before it is parsed -- its length, the
digits of a literal, the nesting of parentheses, calls and unary operators -- so that no text ends
in Python's own limits (RecursionError, "Exceeds the limit (4300 digits)") or a hang; a builder
term that shares its parts (``t = t + t`` 40 times: 2**40 parts printed, 41 objects) is refused by
its size at once, before anything walks its parts."""
import pytest

from cbrules.ir.builder import BuildError, Kernel, threadIdx
from cbrules.ir.terms import MAX_LITERAL_DIGITS, MAX_TERM_DEPTH, MAX_TERM_TEXT, TermSyntaxError, extent, parse
from hostile import within

HOSTILE_TEXT = {
    "5,000-digit literal": ("1" * 5000, "a number of 5000 digits"),
    "5,000-digit float": ("1." + "0" * 5000, "a number of 5002 digits"),
    "10,000 nested parentheses": ("(" * 10_000 + "x" + ")" * 10_000, "nests parentheses, calls and unary"),
    "10,000 unclosed parentheses": ("(" * 10_000, "nests parentheses, calls and unary"),
    "10,000 unary minus": ("-" * 10_000 + "x", "nests parentheses, calls and unary"),
    "10,000 logical nots": ("!" * 10_000 + "x", "nests parentheses, calls and unary"),
    "5,000 nested min()": ("min(" * 5000 + "x" + ", 1)" * 5000, "nests parentheses, calls and unary"),
    "a chain 6,000 long": ("x" + " + x" * 6000, "operators deep"),
    "200,000 characters": ("x " * 100_000, f"a term is at most {MAX_TERM_TEXT} characters"),
}


@pytest.mark.parametrize("case", list(HOSTILE_TEXT))
def test_hostile_term_text_is_a_named_error_within_seconds(case):
    text, needle = HOSTILE_TEXT[case]
    with within(10), pytest.raises(TermSyntaxError) as e:
        parse(text)
    message = str(e.value)
    assert needle in message and "\n" not in message and len(message) < 400, message


@pytest.mark.parametrize("case", ["5,000-digit literal", "10,000 nested parentheses", "5,000 nested min()"])
def test_hostile_text_given_to_the_builder_is_a_named_error(case):
    k = Kernel("k", block=32)
    n = k.symbol("N")
    x = k.tensor("x", (n,))
    with within(10), pytest.raises(TermSyntaxError):
        k.load(x, HOSTILE_TEXT[case][0])


def test_the_bounds_still_take_what_the_limits_allow():
    deep = "(" * (MAX_TERM_DEPTH - 1) + "x" + ")" * (MAX_TERM_DEPTH - 1)
    assert parse(deep) == parse("x")
    assert parse("9" * MAX_LITERAL_DIGITS).value == int("9" * MAX_LITERAL_DIGITS)
    assert parse("-" * (MAX_TERM_DEPTH - 1) + "x").op == "-"
    nested = "min(" * 50 + "x" + ", 1)" * 50
    assert extent(parse(nested)) == (101, 50)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_a_doubled_builder_term_is_refused_by_its_size_at_once(dtype):
    """The infinity check of integer registers used to walk every printed part first (2**40)."""
    k = Kernel("k", block=32)
    t = threadIdx.x
    for _ in range(40):
        t = t + t
    with within(10):
        for build in (lambda: k.assign(t, dtype=dtype), lambda: k.add(t, 1, dtype=dtype),
                      lambda: k.select(t.lt(1), t, 0, dtype=dtype)):
            with pytest.raises(BuildError, match=r"more than 5000 parts as printed \(21990232555\d\d\)"):
                build()
