"""The .uir format: the printer, the parser with its sugar, parse errors, and the exact round trip."""
import math
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from uopc.dtype import dtypes, AddrSpace
from uopc.uop import UOp, Ops, ParamArg, CallArg, AxisType, stack, buf, range_, sink, call_params
from uopc.uir import parse, to_uir, ParseError

SYLLABUS = """# gemm_256x256.uir
%0 = buffer 65536 : dtype=f32 slot=0
%1 = buffer 65536 : dtype=f32 slot=1
%2 = reshape %0, (256, 256, 1)
%3 = reshape %1, (256, 1, 256)
%4 = mul %2, %3
%5 = reduce %4 : op=add pop=1
"""


def param(slot, dtype=dtypes.i32, shape=()): return UOp(Ops.PARAM, (), ParamArg(slot, dtype, shape))


def test_uir_roundtrip_and_syllabus_example():
  g = parse(SYLLABUS)
  assert g.op is Ops.REDUCE and g.shape == (256, 256) and g.dtype is dtypes.f32
  mul = g.src[0]
  assert mul.src[0].op is Ops.EXPAND and mul.src[0].shape == (256, 256, 256)   # broadcasting sugar inserted the EXPANDs
  assert parse(to_uir(g)) is g


def test_broadcasting_and_literal_typing_sugar():
  g = parse("""
  %row = stack 1.0, 2.0, 3.0
  %m   = stack %row, %row      # shape (2, 3)
  %b   = stack 10.0, 20.0, 30.0
  %s   = add %m, %b            # (2,3) + (3,): broadcast
  %t   = mul %s, 2             # bare 2 adopts f32
  """)
  assert g.shape == (2, 3) and g.dtype is dtypes.f32
  assert to_uir(g) == ("%0 = stack 1.0, 2.0, 3.0\n%1 = stack %0, %0\n%2 = stack 10.0, 20.0, 30.0\n%3 = reshape %2, (1, 3)\n"
                       "%4 = expand %3, (2, 3)\n%5 = add %1, %4\n%6 = reshape 2.0, (1, 1)\n%7 = expand %6, (2, 3)\n%8 = mul %5, %7\n")


def test_names_are_renumbered_and_constants_printed_inline():
  g = parse("%x = param : slot=0 dtype=f32\n%y = add %x, 1.0\n%z = mul %y, %y")
  assert to_uir(g) == "%0 = param : slot=0 dtype=f32\n%1 = add %0, 1.0\n%2 = mul %1, %1\n"
  assert to_uir(UOp.const(3.5)) == "%0 = const 3.5\n"


def test_call_and_index_programs():
  sq = parse("%0 = param : slot=0 dtype=i32\n%1 = mul %0, %0\n%2 = call %1, 7 : name=sq")
  assert sq.op is Ops.CALL and sq.arg == CallArg("sq") and sq.src[1] is UOp.const(7)
  ix = parse("%0 = stack 1, 2, 3\n%1 = stack 4, 5, 6\n%2 = stack %0, %1\n%3 = param : slot=0 dtype=i32\n%4 = index %2, %3, 2")
  assert ix.shape == () and ix.src[2] is UOp.const(2)


def test_literal_round_trips_exercise_6():
  """A printed literal parses back to the same CONST: dtype (2 vs 2.0), -0.0, inf, nan, bools, i32 extremes."""
  for v in [-0.0, 0.0, math.inf, -math.inf, math.nan, True, False, 2**31 - 1, -2**31, 1e20, 1e-300, 0.1, 2, 2.0]:
    c = UOp.const(v)
    assert parse(to_uir(c)) is c
    assert parse(to_uir(c + c)) is c + c
  # WHERE with literal branches: the literals are typed by the branches, never by the bool condition
  c = param(0) < param(1)
  w = c.where(1, 0)
  assert to_uir(w).splitlines()[-1] == "%3 = where %2, 1, 0"
  assert parse(to_uir(w)) is w
  x = param(2, dtypes.f32)
  for g in [c.where(x, 0.0), c.where(1.5, x), c.where(True, False), UOp.const(True).where(x, -0.0)]:
    assert parse(to_uir(g)) is g


def test_structured_args_round_trip():
  r = range_(10, 3, AxisType.REDUCE)
  acc = UOp(Ops.ALLOC, (), ParamArg(1, dtypes.f32, (16,), AddrSpace.SHARED))
  prog = sink(acc.after(r).index(r).store(UOp.const(1.0)).end(r), buf(0, 4, dtypes.i32).index(0).store(UOp.const(-7)))
  assert parse(to_uir(prog)) is prog
  for g in [buf(0, 12).reshape((3, 4)).permute((1, 0)).shrink(((1, 3), (0, 2))), buf(0, 3).reduce(Ops.MAX, 1),
            UOp(Ops.CAST, (param(0, dtypes.f32),), dtypes.f32),          # an identity CAST is still a node
            UOp(Ops.CALL, (param(0) * 2, UOp.const(1)), CallArg("name with spaces # and hash")),
            UOp(Ops.PARAM, (), ParamArg(0, dtypes.f16, (2, 3))), UOp(Ops.WMMA, (param(0, dtypes.f16), param(1, dtypes.f16), param(2, dtypes.f32))),
            UOp(Ops.STAGE, (buf(0, 4),)), UOp(Ops.BARRIER, ()), UOp(Ops.SINK, (), arg="named")]:
    assert parse(to_uir(g)) is g


PARSE_ERRORS = [
  ("%0 = add %1, 2", "line 1: '%0 = add %1, 2': undefined %1"),
  ("%0 = stack 1.0, 2.0\n%1 = stack 1.0, 2.0, 3.0\n%2 = add %0, %1", "line 3: '%2 = add %0, %1': can't broadcast (2,) with (3,)"),
  ("x = const 1", "line 1: 'x = const 1': statement must start with %name ="),
  ("%0 = frobnicate 1", "unknown op 'frobnicate'"),
  ("%0 = const 1 : dtype=f99", "unknown dtype 'f99'"),
  ("%0 = const 1.0\n%1 = add %0, 1 : slot=3", "add takes no attribute 'slot'"),
  ("%0 = buffer 4 : slot=x", "slot must be an integer"),
  ("%0 = reshape", "reshape needs a tuple"),
  ("%0 = const 1\n%0 = const 2", "%0 is defined twice"),
  ("%0 = const 1e", "bad literal '1e'"),
  ("%0 = const 1\n%1 = add %0, 1.5", "float literal 1.5 next to a i32 operand"),
  ("%0 = const 1\n%1 = const 1.0\n%2 = add %0, %1", "Ops.ADD: dtype mismatch dtypes.i32 vs dtypes.f32 (use CAST)"),
  ("%0 = reduce 1.0 : op=mul", "reduce op must be add or max"),
  ("%0 = range 4 : kind=sideways", "kind must be one of"),
  ("%0 = const 99999999999", "does not fit in i32"),
  ("# only a comment\n\n", "empty program"),
  ("%0 = param", "param needs slot="),
  ("%0 = stack (1, 2)", "tuple literal can't be an operand"),
  ("%0 = buffer 2.5", "buffer size must be an integer"),
]

@pytest.mark.parametrize("text,message", PARSE_ERRORS)
def test_parse_errors_name_the_line(text, message):
  with pytest.raises(ParseError) as e: parse(text)
  assert message in str(e.value)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet="%=:,()#-.0123456789 abcdefghijklmnopqrstuvwxyz\n\"", max_size=80))
def test_garbage_gives_a_parse_error_never_a_crash(text):
  try: parse(text)
  except ParseError: pass


# ---- the round-trip property over random well-typed graphs (exercise 7) ------------------------------------------

SPECIAL = {dtypes.f32: [0.0, -0.0, math.inf, -math.inf, math.nan, 1.5, -2.25, 1e-30, 3.0],
           dtypes.i32: [0, 1, -1, 2**31 - 1, -2**31, 7, -3], dtypes.bool: [True, False]}


@st.composite
def graphs(draw):
  """A random well-typed graph: CONSTs of every dtype (with -0.0, inf, nan, i32 extremes), STACKs, ALU, WHERE with
  literal and non-literal branches, CAST, INDEX with constant indices, movement ops, REDUCE, PARAMs and CALL."""
  pool: list[UOp] = [param(0), param(1, dtypes.f32), param(2, dtypes.bool)]
  for _ in range(draw(st.integers(1, 12))):
    kind = draw(st.sampled_from(["const", "stack", "alu", "where", "cast", "index", "move", "reduce", "call"]))
    def pick(pred=lambda u: True):
      cands = [u for u in pool if pred(u)]
      return draw(st.sampled_from(cands)) if cands else None
    if kind == "const":
      d = draw(st.sampled_from(list(SPECIAL)))
      pool.append(UOp.const(draw(st.sampled_from(SPECIAL[d])), d))
    elif kind == "stack" and (a := pick(lambda u: len(u.shape) < 3)) is not None:
      same = [u for u in pool if u.shape == a.shape and u.dtype is a.dtype]
      pool.append(UOp(Ops.STACK, tuple(draw(st.sampled_from(same)) for _ in range(draw(st.integers(1, 3))))))
    elif kind == "alu" and (a := pick()) is not None:
      same = [u for u in pool if u.shape == a.shape and u.dtype is a.dtype]
      ops = [Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE] + ([Ops.FLOORDIV, Ops.FLOORMOD] if a.dtype is dtypes.i32 else [])
      op = draw(st.sampled_from(ops + ([Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN] if a.dtype is dtypes.f32 else [])))
      pool.append(UOp(op, (a,)) if op in (Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN) else UOp(op, (a, draw(st.sampled_from(same)))))
    elif kind == "where" and (c := pick(lambda u: u.dtype is dtypes.bool)) is not None:
      branches = [u for u in pool if u.shape == c.shape and u.dtype is not dtypes.bool] or [c]
      a = draw(st.sampled_from(branches))
      lit = draw(st.sampled_from(SPECIAL.get(a.dtype, [0.0])))
      pool.append(draw(st.sampled_from([c.where(a, lit), c.where(lit, a), c.where(a, a)])) if c.shape == () else c.where(a, a))
    elif kind == "cast" and (a := pick()) is not None:
      pool.append(UOp(Ops.CAST, (a,), draw(st.sampled_from([dtypes.i32, dtypes.f32, dtypes.bool, dtypes.f16]))))
    elif kind == "index" and (a := pick(lambda u: u.shape and 0 not in u.shape)) is not None:
      pool.append(a.index(*(draw(st.integers(0, s - 1)) for s in a.shape[:draw(st.integers(1, len(a.shape)))])))
    elif kind == "move" and (a := pick(lambda u: u.shape)) is not None:
      m = draw(st.sampled_from(["reshape", "permute", "shrink", "expand"]))
      if m == "reshape": pool.append(a.reshape((1,) + a.shape))
      elif m == "permute": pool.append(a.permute(tuple(draw(st.permutations(range(len(a.shape)))))))
      elif m == "shrink": pool.append(a.shrink(tuple((0, draw(st.integers(0, s))) for s in a.shape)))
      else: pool.append(a.reshape((1,) + a.shape).expand((2,) + a.shape))
    elif kind == "reduce" and (a := pick(lambda u: u.shape and u.dtype is not dtypes.bool)) is not None:
      pool.append(a.reduce(draw(st.sampled_from([Ops.ADD, Ops.MAX])), draw(st.integers(0, len(a.shape)))))
    elif kind == "call" and (a := pick(lambda u: u.shape == () and u.dtype is dtypes.i32 and set(call_params(u)) <= {param(0)})) is not None:
      pool.append(UOp(Ops.CALL, (param(0) * a, UOp.const(draw(st.sampled_from(SPECIAL[dtypes.i32])))), CallArg("f")))
  return draw(st.sampled_from(pool))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(graphs())
def test_round_trip_property(g):
  assert parse(to_uir(g)) is g


def test_stack_of_one_and_nested_stacks():
  for g in [stack(1), stack(stack(1.0)), stack(stack(True, False), stack(False, True))]:
    assert parse(to_uir(g)) is g


def test_a_gather_round_trips():
  rows = stack(stack(1.0, 2.0), stack(3.0, 4.0), stack(5.0, 6.0))
  g = rows.gather(stack(stack(2, 0), stack(1, 1)) + UOp.const(0).reshape((1, 1)).expand((2, 2)))
  text = to_uir(g)
  assert "gather" in text and parse(text) is g
