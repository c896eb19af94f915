"""Deep graphs: nothing recurses on graph depth (a recursive pass dies past ~1,000 nodes). Chains of 50,000 nodes go through every pass,
and a chain of 1,000,000 through toposort, without RecursionError."""
import gc, pickle
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, ParamArg
from uopc.uir import parse, to_uir
from uopc.rewrite import UPat, PatternMatcher, graph_rewrite
from uopc.symbolic import simplify

N = 50_000   # 50 times the recursion limit: a recursive pass fails long before; 10^6 is toposort's test below


def chain(n: int, dtype=dtypes.f32) -> UOp:
  c = UOp(Ops.PARAM, (), ParamArg(0, dtype))
  one = UOp.const(1, dtype)
  for _ in range(n): c = c + one
  return c


def test_deep_graph_no_recursion_error():
  c = chain(N)
  order = c.toposort()
  assert len(order) == N + 2 and order[-1] is c
  x = order[0]
  swapped = c.substitute({x: UOp(Ops.PARAM, (), ParamArg(1, dtypes.f32))})
  assert swapped.src[1] is c.src[1] and swapped is not c
  text = to_uir(c)
  assert text.count("\n") == N + 1 and parse(text) is c
  assert pickle.loads(pickle.dumps(c)) is c
  assert repr(c).startswith("UOp(Ops.ADD")


def test_deep_graph_rewrite_and_simplify():
  c = chain(N)
  to_mul = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("k"))), lambda a, k: UOp(Ops.MUL, (a, k)))])
  m = graph_rewrite(c, to_mul)
  assert m.op is Ops.MUL and len(m.toposort()) == N + 2
  assert simplify(m) is UOp(Ops.PARAM, (), ParamArg(0, dtypes.f32))        # x*1.0*1.0*... is x, exactly
  i = chain(N, dtypes.i32)
  assert simplify(i) is UOp(Ops.PARAM, (), ParamArg(0, dtypes.i32)) + N


def test_million_node_chain_toposort():
  c = chain(1_000_000)
  assert len(c.toposort()) == 1_000_002
  del c
  gc.collect()
