import pytest

from cbrules.ir.terms import (DEVICE_FUNCTIONS, DeviceFunctionError, Term, TermSyntaxError, as_term, call, evaluate, name,
                           parse, substitute, to_c)


@pytest.mark.parametrize("text", ["(i + 2) % 3", "i / 3 % 2", "a - (b - c)", "a - b - c", "-x + 1",
                                  "threadIdx.x < 32 && elect_one()", "min(a, b + 1) * 4", "!(a == b) || c"])
def test_parse_print_round_trip(text):
    t = parse(text)
    assert to_c(parse(to_c(t))) == to_c(t)
    assert parse(to_c(t)) == t


def test_precedence_and_parentheses():
    assert to_c(parse("(i + 2) % 3")) == "(i + 2) % 3"
    assert to_c(parse("i + 2 % 3")) == "i + 2 % 3"
    assert to_c(parse("a - (b - c)")) == "a - (b - c)"
    assert parse("a - b - c") == Term("-", (Term("-", (name("a"), name("b"))), name("c")))


def test_operators_build_terms():
    i = name("i")
    assert (i + 2) % 3 == parse("(i + 2) % 3")
    assert (2 * i) // 4 == parse("2 * i / 4")
    assert i.lt(10).and_(i.ge(0)) == parse("i < 10 && i >= 0")


def test_c_semantics_of_division():
    assert evaluate(parse("-7 / 2"), {}) == -3
    assert evaluate(parse("-7 % 2"), {}) == -1
    assert evaluate(parse("(i + 4) / 4 % 2"), {"i": 5}) == 0
    assert evaluate(call("ceil_div", 1000, 256), {}) == 4


def test_names_and_substitution():
    t = parse("(i + P) % S")
    assert set(t.names()) == {"i", "P", "S"}
    assert substitute(t, {"i": parse("i + 1")}) == parse("(i + 1 + P) % S")


def test_syntax_errors_name_the_column():
    with pytest.raises(TermSyntaxError, match="column 5"):
        parse("i + $")
    with pytest.raises(TermSyntaxError, match="expected"):
        parse("(i + 1")
    with pytest.raises(TypeError):
        as_term([1])


def test_ceil_div_matches_the_device_for_negative_operands():
    # the device computes (a + b - 1) / b with truncating division
    assert evaluate(call("ceil_div", -5, 4), {}) == 0
    assert evaluate(call("ceil_div", 5, 4), {}) == 2


def test_calls_come_only_from_the_device_function_table():
    assert set(DEVICE_FUNCTIONS) == {"elect_one", "elect_warp", "ceil_div", "min", "max", "swizzle", "byte_perm"}
    with pytest.raises(DeviceFunctionError, match="not a device function.*ceil_div/2"):
        call("atomicAdd", 1)
    with pytest.raises(DeviceFunctionError, match=r"min\(\) takes 2 argument\(s\), got 3"):
        call("min", 1, 2, 3)
    with pytest.raises(DeviceFunctionError, match="column 5"):
        parse("i + printf(i)")
    assert parse("min(i, 2)") == call("min", name("i"), 2)


def test_names_and_digits_are_ascii():
    with pytest.raises(TermSyntaxError):
        parse("i\u00e9 + 1")  # a letter C does not take in an identifier
    with pytest.raises(TermSyntaxError):
        parse("\u0663")  # an Arabic-Indic digit is not a C digit


def test_host_evaluation_follows_the_table():
    assert evaluate(call("max", 3, 4), {}) == 4
    with pytest.raises(KeyError, match="elect_one"):
        evaluate(call("elect_one"), {})  # only the device can elect a thread


def test_byte_perm_takes_integers_in_the_interpreter():
    import numpy as np
    from cbrules.reference.vterms import CACHE, Lanes, TermError, compile_term
    lanes = Lanes(np.ones(4, bool), None)
    assert int(compile_term(call("byte_perm", 0x33221100, 0x77665544, 0x1054))({CACHE: {}}, lanes)) == 0x11005544
    with pytest.raises(TermError, match="takes unsigned integers"):
        compile_term(call("byte_perm", 1.5, 2, 0x5410))({CACHE: {}}, lanes)
