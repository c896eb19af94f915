"""The hostile-input catalogue of uopc-ir: every public entry point (UOp construction, the .uir parser and printer, the
rewrite engine, the evaluator, the simplifier, the composite ops) given the malformed inputs a user can produce. Each
one gives a correct answer or a one-line error of the project's own exception types (UOpError, ParseError,
RewriteError, EvalError); no RecursionError, MemoryError, ZeroDivisionError, AttributeError or TypeError escapes."""
import math, random
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, ParamArg, RangeArg, CallArg, UOpError, buf, range_, stack
from uopc.uir import parse, to_uir, ParseError
from uopc.rewrite import UPat, PatternMatcher, graph_rewrite, RewriteError
from uopc.evaluate import run, to_python, EvalError, RUN_MAX_ELEMENTS
from uopc.symbolic import simplify, bounds
from uopc.composite import pad, pad_axis, flip_axis, concat2, move_axis
from hostile import raises_one_line

OUR_ERRORS = (UOpError, ParseError, RewriteError, EvalError)
x = UOp.const(1.5).reshape((1,)).expand((3,))


def one_line_error(fn, kind=OUR_ERRORS, match: str | None = None) -> str: return raises_one_line(fn, kind, match)


# ---- UOp construction ----------------------------------------------------------------------------------------------------

BAD_UOPS = {
  "a list for a shape": (lambda: UOp(Ops.RESHAPE, (x,), [3]), "RESHAPE needs a tuple"),
  "a fractional buffer size": (lambda: buf(0, 2.5), "a buffer's size is an int"),
  "a string buffer size": (lambda: buf(0, "3"), "a buffer's size is an int"),
  "a dict as a CONST": (lambda: UOp(Ops.CONST, (), {}), "CONST holds"),
  "None for the sources": (lambda: UOp(Ops.ADD, None), "src must be a tuple of UOps"),
  "an int for the sources": (lambda: UOp(Ops.ADD, 5), "src must be a tuple of UOps"),
  "a python number as a source": (lambda: UOp(Ops.ADD, (x, 2.0)), "sources must be UOps"),
  "an unhashable source": (lambda: UOp(Ops.ADD, (x, [1])), "sources must be UOps"),
  "an op given by name": (lambda: UOp("ADD", (x, x)), "no inference rule"),
  "an unhashable op": (lambda: UOp([Ops.ADD], (x, x)), "no inference rule"),
  "a tuple arg nested 5000 deep": (lambda: UOp(Ops.RESHAPE, (x,), _nested_tuple(5000)), "nested more than"),
  "a list arg nested 5000 deep": (lambda: UOp(Ops.RESHAPE, (x,), _nested_list(5000)), "RESHAPE needs a tuple"),
  "a shape nested 5000 deep": (lambda: x.reshape(_nested_list(5000)), "expected a tuple of integers"),
  "a CONST of 2**40": (lambda: UOp.const(2**40), "does not fit in i32"),
  "a CONST of 10**5000": (lambda: UOp.const(10**5000), "does not fit in i32"),
  "a CONST of a string": (lambda: UOp.const("1"), "a CONST holds"),
  "a CONST of a nested tuple": (lambda: UOp.const(_nested_tuple(5000)), "a CONST holds"),
  "a negative reshape": (lambda: x.reshape((-1, -3)), "non-negative"),
  "a float shape": (lambda: x.reshape((1.5, 2)), "expected a tuple of integers"),
  "a PARAM dtype given as a string": (lambda: UOp(Ops.PARAM, (), ParamArg(0, "f32")), "bad dtype"),
  "a PARAM shape given as a list": (lambda: UOp(Ops.PARAM, (), ParamArg(0, dtypes.f32, [2])), "bad shape"),
  "a negative slot": (lambda: buf(-1, 4), "slot must be a non-negative int"),
  "a BUFFER past i32's reach": (lambda: buf(0, 2**40), "an i32 index reaches at most"),
  "a RANGE ending at 2.5": (lambda: range_(2.5, 0), "a RANGE ends at an integer"),
  "a RANGE ending past i32": (lambda: range_(2**40, 0), "does not fit in i32"),
  "a RANGE with a string arg": (lambda: UOp(Ops.RANGE, (UOp.const(3),), "x"), "RANGE needs a RangeArg"),
  "a REDUCE by MUL": (lambda: x.reduce(Ops.MUL), "REDUCE"),
  "a REDUCE of more axes than there are": (lambda: x.reduce(Ops.ADD, 2), "REDUCE"),
  "a permutation of floats": (lambda: x.permute((0.0,)), "expected a tuple of integers"),
  "a CAST to a string": (lambda: x.cast("f32"), "CAST needs a value dtype"),
  "an INDEX by a float": (lambda: x.index(UOp.const(0.5)), "INDEX indices are i32 scalars"),
  "too many INDEX indices": (lambda: x.index(0, 0), "indices into shape"),
  "a STACK of None": (lambda: UOp(Ops.STACK, (None,)), "sources must be UOps"),
  "a STACK of nothing": (lambda: UOp(Ops.STACK, ()), "STACK of nothing"),
  "a SHRINK past the end": (lambda: x.shrink(((0, 4),)), "SHRINK"),
  "an EXPAND of a non-1 axis": (lambda: x.expand((6,)), "EXPAND"),
  "a WHERE on a float": (lambda: UOp(Ops.WHERE, (x, x, x)), "WHERE condition must be bool"),
  "a CALL with a missing argument": (lambda: UOp(Ops.CALL, (UOp(Ops.PARAM, (), ParamArg(0, dtypes.f32)),), CallArg()), "CALL needs params"),
  "FLOORDIV of floats": (lambda: UOp(Ops.FLOORDIV, (x, x)), "integer only"),
}


def _nested_tuple(depth: int):
  t: tuple = (1,)
  for _ in range(depth): t = (t,)
  return t


def _nested_list(depth: int):
  t: list = [1]
  for _ in range(depth): t = [t]
  return t


@pytest.mark.parametrize("case", list(BAD_UOPS))
def test_a_malformed_uop_is_a_one_line_uop_error(case):
  fn, match = BAD_UOPS[case]
  one_line_error(fn, UOpError, match)


JUNK = st.one_of(st.none(), st.integers(-2**40, 2**40), st.floats(), st.text(max_size=5), st.booleans(), st.just([1, 2]), st.just({}),
                 st.tuples(st.integers(-3, 5), st.integers(-3, 5)), st.just(((0, 1),)), st.sampled_from(list(Ops)), st.sampled_from(dtypes.all),
                 st.just(x), st.just(UOp.const(1)), st.just(UOp.const(True)), st.just(ParamArg(0, dtypes.f32)), st.just(RangeArg(0)))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op=st.one_of(st.sampled_from(list(Ops)), JUNK), src=st.one_of(st.lists(JUNK, max_size=3), JUNK), arg=JUNK)
def test_random_junk_builds_a_uop_or_raises_uop_error(op, src, arg):
  try: u = UOp(op, src, arg)
  except UOpError as e: assert str(e) and "\n" not in str(e)
  else: assert isinstance(u, UOp) and UOp(op, src, arg) is u   # what is built is hash-consed like any other node


# ---- the .uir parser and printer -------------------------------------------------------------------------------------------

BAD_PROGRAMS = {
  "50,000 nested parentheses as an op's tuple": ("%0 = reshape " + "(" * 50_000 + ")" * 50_000, "nested more than"),
  "50,000 nested parentheses around a constant": ("%0 = const " + "(" * 50_000 + "1" + ")" * 50_000, "a CONST holds"),
  "500,000 unclosed parentheses": ("%0 = const 1.0\n%1 = reshape %0, " + "(" * 500_000, "unclosed tuple"),
  "a tuple with a missing comma": ("%0 = const 1.0\n%1 = reshape %0, (1 1)", "missing ','"),
  "a tuple with two commas": ("%0 = const 1.0\n%1 = reshape %0, (1,,)", "misplaced ','"),
  "a tuple closed twice": ("%0 = const 1.0\n%1 = reshape %0, (1))", "bad tuple literal"),
  "a 5000-digit integer": ("%0 = const " + "9" * 5000, "line 1"),
  "a line of a million characters": ("%0 = const 1" + " " * 10**6 + "x", "line 1"),
  "a NUL byte": ("%0 = const 1\x00", "line 1"),
  "a buffer past i32": ("%0 = buffer 3000000000 : dtype=f32 slot=0", "an i32 index reaches at most"),
  "a string where a name goes": ('%0 = call "x"', "line 1"),
}


@pytest.mark.parametrize("case", list(BAD_PROGRAMS))
def test_a_hostile_program_is_a_one_line_parse_error_that_names_the_line(case):
  text, match = BAD_PROGRAMS[case]
  msg = one_line_error(lambda: parse(text), ParseError, match)
  assert msg.startswith("line ")


def test_parse_refuses_what_is_not_program_text():
  for junk in (b"%0 = const 1", None, 3, ["%0 = const 1"]): one_line_error(lambda: parse(junk), ParseError, "takes the program text")


def test_legal_extremes_still_parse():
  assert parse("%0 = const 1.0\n%1 = reshape %0, (1)").shape == (1,)                  # (1) is the 1-tuple, as before
  assert parse("%0 = const " + "9" * 5000 + ".5").arg == math.inf            # a float literal rounds, to inf if it must (as C's)


@st.composite
def mutated_programs(draw):
  """A valid program with a few characters deleted, duplicated or replaced: the typos and truncations users make."""
  text = to_uir(draw(st.sampled_from(SAMPLES)))
  for _ in range(draw(st.integers(1, 4))):
    i = draw(st.integers(0, max(0, len(text) - 1)))
    kind = draw(st.sampled_from(["delete", "duplicate", "replace", "truncate"]))
    if kind == "delete": text = text[:i] + text[i + 1:]
    elif kind == "duplicate": text = text[:i] + text[i:i + 3] * 2 + text[i + 3:]
    elif kind == "replace": text = text[:i] + draw(st.sampled_from(list("%=:,()#-.0123456789 \n\"e[]{}\\"))) + text[i + 1:]
    else: text = text[:i]
  return text


SAMPLES = [(buf(0, 12).reshape((3, 4)) * 2.0).reduce(Ops.ADD, 1), (UOp.const(3) < range_(5, 0)).where(1.5, -0.0),
           stack(1.0, math.inf, math.nan).shrink(((1, 3),)),
           UOp(Ops.CALL, (UOp(Ops.PARAM, (), ParamArg(0, dtypes.i32)) * 2, UOp.const(4)), CallArg("g"))]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_programs())
def test_a_mangled_program_parses_or_gives_a_parse_error(text):
  try: g = parse(text)
  except ParseError as e: assert str(e).startswith(("line ", "empty program")) and "\n" not in str(e)
  else: assert parse(to_uir(g)) is g


def test_to_uir_refuses_what_is_not_a_uop():
  one_line_error(lambda: to_uir(3), UOpError, "to_uir prints a UOp")


# ---- rewrite, simplify, bounds, the composite ops -------------------------------------------------------------------------

def test_the_rewrite_engine_refuses_malformed_rules_and_arguments():
  one_line_error(lambda: graph_rewrite(3, PatternMatcher([])), RewriteError, "graph_rewrite rewrites a UOp")
  one_line_error(lambda: graph_rewrite(x, [(UPat(Ops.ADD), lambda: None)]), RewriteError, "needs a PatternMatcher")
  one_line_error(lambda: PatternMatcher(3), RewriteError, "list of (UPat, function) pairs")
  one_line_error(lambda: PatternMatcher([(3, lambda: None)]), RewriteError, "is not a UPat")
  one_line_error(lambda: PatternMatcher([(UPat(Ops.ADD), "x*1")]), RewriteError, "not a function")
  one_line_error(lambda: UPat(3), RewriteError, "UPat op must be")
  one_line_error(lambda: UPat(Ops.ADD, src=3), RewriteError, "UPat src must be")
  one_line_error(lambda: UPat(Ops.ADD, dtype=3), RewriteError, "UPat dtype must be")
  returns_int = PatternMatcher([(UPat(Ops.EXPAND, name="u"), lambda u: 3)])
  one_line_error(lambda: graph_rewrite(x, returns_int), RewriteError, "not a UOp or None")
  loops = PatternMatcher([(UPat(Ops.ADD, name="u"), lambda u: UOp(Ops.ADD, (u.src[1], u.src[0])))])
  i = range_(4, 0)
  one_line_error(lambda: graph_rewrite(i + range_(5, 1), loops), RewriteError, "loop")


def test_simplify_and_bounds_refuse_what_is_not_a_uop():
  one_line_error(lambda: simplify(3), UOpError, "simplify takes a UOp")
  one_line_error(lambda: bounds("i"), UOpError, "bounds takes a UOp")


def test_the_composite_ops_refuse_bad_axes_and_paddings():
  one_line_error(lambda: pad(x, ((1,),)), UOpError, "(before, after) pair")
  one_line_error(lambda: pad(x, ((1, 2), (0, 0))), UOpError, "pairs for shape")
  one_line_error(lambda: pad(x, ((-1, 2),)), UOpError, "non-negative")
  one_line_error(lambda: pad_axis(x, 3, 1, 1), UOpError, "out of range")
  one_line_error(lambda: flip_axis(x, -2), UOpError, "out of range")
  one_line_error(lambda: flip_axis([1, 2], 0), UOpError, "takes a UOp")
  one_line_error(lambda: move_axis(x, 0, 1), UOpError, "out of range")
  one_line_error(lambda: concat2(x, x.cast(dtypes.i32), 0), UOpError, "equal shapes and dtypes")
  assert to_python(pad(stack(1, 2), ((2, 1),))) == [0, 0, 1, 2, 0]   # and what is legal still works


# ---- the evaluator -------------------------------------------------------------------------------------------------------

def test_run_refuses_values_too_big_to_hold_in_python_before_starting():
  one = UOp.const(1.0).reshape((1,))
  one_line_error(lambda: run(one.expand((10**9,))), EvalError, "more than its limit")
  one_line_error(lambda: run(one.reshape((1, 1)).expand((10**5, 10**5)).reduce(Ops.ADD, 1)), EvalError, "more than its limit")
  assert to_python(one.expand((RUN_MAX_ELEMENTS // 4,)).reduce(Ops.ADD, 1)) == RUN_MAX_ELEMENTS // 4


def test_run_errors_are_eval_errors():
  one_line_error(lambda: run(3), EvalError, "run takes a UOp")
  one_line_error(lambda: run(UOp.const(7) // UOp.const(0)), EvalError, "division by zero")
  one_line_error(lambda: run(UOp.const(7) % UOp.const(0)), EvalError, "modulo by zero")
  one_line_error(lambda: run(stack(1, 2).index(UOp.const(5))), EvalError, "out of range")
  one_line_error(lambda: run(buf(0, 4)), EvalError, "memory")


def test_a_deep_random_expression_evaluates_without_recursion():
  rng = random.Random(0)
  steps = [rng.randrange(4) for _ in range(20_000)]
  e, v = UOp.const(1), 1
  for k in steps:
    e = [lambda a: a + 3, lambda a: a * 7, lambda a: a // 2, lambda a: a.maximum(-5)][k](e)
    v = [lambda a: a + 3, lambda a: a * 7, lambda a: a // 2, lambda a: max(a, -5)][k](v)
    v = (v + 2**31) % 2**32 - 2**31   # i32 wraps
  assert to_python(e) == v
