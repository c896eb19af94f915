"""The rewrite engine: UPat matching, PatternMatcher dispatch, graph_rewrite and its checks."""
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, ParamArg, stack
from uopc.rewrite import UPat, PatternMatcher, graph_rewrite, RewriteError


def param(slot, dtype=dtypes.i32, shape=()): return UOp(Ops.PARAM, (), ParamArg(slot, dtype, shape))

x, y = param(0), param(1)


def test_upat_matches_op_src_arg_dtype_and_captures():
  pat = UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("c")))
  assert pat.match(x + 3, {}) == [{"a": x, "c": UOp.const(3)}]
  assert pat.match(x * 3, {}) == [] and pat.match(x + y, {}) == []
  assert UPat(Ops.CONST, arg=1).match(UOp.const(1), {}) and not UPat(Ops.CONST, arg=1).match(UOp.const(1.0), {})
  assert not UPat(Ops.CONST, arg=1).match(UOp.const(True), {})           # 1 == True in python, not here
  assert UPat(dtype=dtypes.f32).match(UOp.const(1.0), {}) and not UPat(dtype=dtypes.f32).match(UOp.const(1), {})
  assert UPat({Ops.ADD, Ops.MUL}).match(x * y, {}) and not UPat({Ops.ADD, Ops.MUL}).match(x < y, {})


def test_list_sources_match_any_permutation():
  pat = UPat(Ops.ADD, src=[UPat.var("a"), UPat.cvar("c")])
  assert pat.match(UOp(Ops.ADD, (UOp.const(3), x)), {}) == [{"c": UOp.const(3), "a": x}]
  assert pat.match(x + 3, {}) == [{"a": x, "c": UOp.const(3)}]


def test_a_repeated_name_must_bind_the_same_node():
  pat = UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("a")))
  assert pat.match(x + x, {}) == [{"a": x}] and pat.match(x + y, {}) == []


def test_single_upat_source_matches_every_source():
  pat = UPat(Ops.STACK, src=UPat(Ops.CONST))
  assert pat.match(stack(1, 2, 3), {}) and not pat.match(UOp(Ops.STACK, (UOp.const(1), x)), {})


def test_upat_sugar_reads_like_the_law():
  pm = PatternMatcher([(UPat.var("a") * 1, lambda a: a), (UPat.var("a") + 0, lambda a: a)])
  assert pm.rewrite(x * 1) is x and pm.rewrite(UOp(Ops.MUL, (UOp.const(1), x))) is x and pm.rewrite(x + 0) is x
  assert pm.rewrite(x * 2) is None


def test_rules_are_indexed_by_op():
  pm = PatternMatcher([(UPat(Ops.ADD, name="u"), lambda u: u), (UPat(Ops.MUL, name="u"), lambda u: u), (UPat(name="u"), lambda u: None)])
  assert len(pm.pdict[Ops.ADD]) == 2 and len(pm.pdict[Ops.MUL]) == 2 and len(pm.pdict[Ops.SIN]) == 1


def test_first_rule_that_returns_a_node_wins_and_none_falls_through():
  pm = PatternMatcher([(UPat(Ops.ADD), lambda: None), (UPat(Ops.ADD, name="u"), lambda u: u.src[0]), (UPat(Ops.ADD), lambda: UOp.const(9))])
  assert pm.rewrite(x + y) is x


def test_ctx_is_passed_by_name():
  seen = []
  pm = PatternMatcher([(UPat(Ops.ADD, name="u"), lambda ctx, u: seen.append((ctx, u)))])
  graph_rewrite(x + y, pm, ctx="the context")
  assert seen == [("the context", x + y)]


def test_rule_must_take_its_captures():
  with pytest.raises(RewriteError, match=r"does not take the capture\(s\) \['b'\]"):
    PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("b"))), lambda a: a)])


def test_pattern_matchers_concatenate():
  a = PatternMatcher([(UPat.var("a") * 1, lambda a: a)])
  b = PatternMatcher([(UPat.var("a") + 0, lambda a: a)])
  both = a + b
  assert both.rewrite(x * 1) is x and both.rewrite(x + 0) is x


fold = PatternMatcher([
  (UPat(Ops.ADD, src=(UPat.cvar("a"), UPat.cvar("b"))), lambda a, b: UOp.const(a.arg + b.arg)),
  (UPat(Ops.MUL, src=(UPat.cvar("a"), UPat.cvar("b"))), lambda a, b: UOp.const(a.arg * b.arg)),
  (UPat.var("v") + 0, lambda v: v),
])


def test_graph_rewrite_reaches_a_fixed_point_sources_first():
  e = (UOp.const(1) + UOp.const(2)) * (UOp.const(3) + UOp.const(4)) + x * (UOp.const(0) + UOp.const(0))
  out = graph_rewrite(e, fold)
  assert out is UOp.const(21) + x * UOp.const(0)


def test_users_of_a_rewritten_node_are_rebuilt_and_hash_consed():
  a = x + (UOp.const(1) + UOp.const(1))
  b = x + UOp.const(2)
  out = graph_rewrite((a * b), fold)
  assert out.src[0] is out.src[1] is b


def test_a_replacement_is_itself_rewritten():
  pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("v"), UPat.cvar("c"))), lambda v, c: v + UOp.const(0) if c.arg == 1 else None)]) + fold
  assert graph_rewrite(x * 1, pm) is x


def test_bottom_up_sees_a_node_before_its_sources():
  seen = []
  pm = PatternMatcher([(UPat(Ops.MUL, name="u"), lambda u: seen.append(u.src[0]))]) + fold
  e = (UOp.const(1) + UOp.const(2)) * x
  graph_rewrite(e, pm, bottom_up=True)
  assert seen[0] is UOp.const(1) + UOp.const(2)    # before the ADD below it was folded
  assert seen[-1] is UOp.const(3)                   # and again after


def test_a_rule_that_changes_dtype_is_named_in_the_error():
  def bool_to_int(u): return UOp.const(1)           # a classic rewrite bug: a bool turned into an i32
  pm = PatternMatcher([(UPat(Ops.CMPLT, name="u"), bool_to_int)])
  message = r"rule .*bool_to_int \(.*test_rewrite.py:\d+\) changed Ops.CMPLT dtypes.bool\(\) into Ops.CONST dtypes.i32\(\)"
  with pytest.raises(RewriteError, match=message):
    graph_rewrite(x < y, pm)


def test_a_rule_that_changes_shape_is_refused():
  v = param(0, dtypes.f32, (3,))
  pm = PatternMatcher([(UPat(Ops.MUL, name="u"), lambda u: UOp.const(1.0))])
  with pytest.raises(RewriteError, match="a replacement must keep the dtype and shape"): graph_rewrite(v * 2.0, pm)
  assert graph_rewrite(v * 2.0, pm, check=False) is UOp.const(1.0)


def test_rules_that_loop_are_an_error_not_a_hang():
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("b"))), lambda a, b: UOp(Ops.ADD, (b, a)))])
  with pytest.raises(RewriteError, match="the rules loop"): graph_rewrite(x + y, pm)
  with pytest.raises(RewriteError, match="the rules loop"): graph_rewrite(x + y, pm, bottom_up=True)


def test_a_shared_memo_skips_work_already_done():
  calls = []
  pm = PatternMatcher([(UPat(Ops.ADD, name="u"), lambda u: calls.append(u))])
  memo: dict = {}
  graph_rewrite(x + y, pm, memo=memo)
  graph_rewrite((x + y) * 2, pm, memo=memo)
  assert calls == [x + y]
