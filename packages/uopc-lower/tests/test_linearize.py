"""The linearizer: placement in the innermost legal loop, hoisting, sibling loop order, determinism."""
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, AxisType, buf, range_, sink
from uopc.rangeify import lower, Ctx, Opts
from uopc.linearize import linearize, LinearizeError
from uopc.uir import parse
from example_programs import gemm_uir, sub_max, sub_max_through_a_flatten, neighbors, conv1d


def nesting(lin: list[UOp]) -> dict[UOp, tuple[int, ...]]:
  """For each node, the RANGE indices of the loops open around it (outermost first)."""
  open_: list[int] = []
  out = {}
  for u in lin:
    if u.op is Ops.END: open_.pop()
    out[u] = tuple(open_)
    if u.op is Ops.RANGE: open_.append(u.arg.idx)
  return out


def allocs(lin): return [u for u in lin if u.op is Ops.ALLOC]
def loads_of(lin, slot): return [u for u in lin if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.BUFFER and u.src[0].src[0].arg.slot == slot]


def test_accumulator_lives_in_the_loops_its_output_index_uses():
  x = buf(0, 12).reshape((3, 4))
  lin = linearize(lower(x.reduce(Ops.ADD, 1), buf(1, 3)))
  nest = nesting(lin)
  [acc] = allocs(lin)
  assert nest[acc] == (0,)
  [load] = loads_of(lin, 0)
  assert nest[load] == (0, 1)


def test_gemm_accumulator_in_the_column_loop_and_row_offset_hoisted():
  N = 4
  g = parse(gemm_uir(N))
  lin = linearize(lower(g, buf(2, N * N)))
  nest = nesting(lin)
  [acc] = allocs(lin)
  assert nest[acc] == (0, 1)
  row = next(u for u in lin if u.op is Ops.MUL and u.dtype is dtypes.i32 and u.src[1] is UOp.const(N) and u.src[0].op is Ops.RANGE
             and u.src[0].arg.idx == 0)
  assert nest[row] == (0,)                         # ridx0*4 is computed once per row, outside the column loop
  assert len([u for u in lin if u.op is Ops.RANGE]) == 3


def test_sibling_loops_are_ordered_by_data_dependencies():
  """sub_max: the max loop (RANGE 2) runs before the column loop (RANGE 1) that reads its result."""
  lin = linearize(lower(sub_max(), buf(1, 12)))
  opened = [u.arg.idx for u in lin if u.op is Ops.RANGE]
  assert opened == [0, 2, 1]
  nest = nesting(lin)
  [acc] = allocs(lin)
  assert nest[acc] == (0,)
  stores = [u for u in lin if u.op is Ops.STORE and u.src[0].src[0].op is Ops.BUFFER]
  assert [nest[s] for s in stores] == [(0, 1)]


def test_loop_invariant_loads_are_hoisted_out_of_the_reduce_loop():
  """conv1d: the three window loads depend on the output index only, so they sit outside the k loop."""
  lin = linearize(lower(conv1d(8, 3), buf(2, 6)))
  nest = nesting(lin)
  assert [nest[u] for u in loads_of(lin, 0)] == [(0,), (0,), (0,)]
  assert [nest[u] for u in loads_of(lin, 1)] == [(0, 1)]


def test_without_simplify_at_reshape_the_max_would_be_recomputed_per_column(monkeypatch):
  import uopc.rangeify as R
  from uopc.symbolic import simplify
  y = sub_max_through_a_flatten()
  good = nesting(linearize(lower(y, buf(1, 16))))
  monkeypatch.setattr(R, "simplify", lambda u: u)
  monkeypatch.setattr(R, "_regroup_memo", {})   # (no unravel remembered from an earlier lowering)
  frozen = simplify(lower(y, buf(1, 16)))          # the structure without simplify, the arithmetic cleaned afterwards
  bad = nesting(linearize(frozen))
  assert [v for k, v in good.items() if k.op is Ops.ALLOC] == [(0,)]
  assert [v for k, v in bad.items() if k.op is Ops.ALLOC] == [(0, 1)]


def test_two_accumulators_share_the_loop():
  lin = linearize(lower(neighbors(), buf(1, 3)))
  assert len([u for u in lin if u.op is Ops.RANGE]) == 2 and [nesting(lin)[a] for a in allocs(lin)] == [(0,), (0,)]


def test_order_is_deterministic_and_every_source_comes_first():
  x = buf(0, 64).reshape((8, 8))
  g = (x - x.reduce(Ops.MAX, 1).reshape((8, 1)).expand((8, 8))).reduce(Ops.ADD, 1)
  s = lower(g, buf(1, 8), Ctx(opts=Opts(upcast={0: 2}, unroll=2)))
  a, b = linearize(s), linearize(s)
  assert a == b
  seen = set()
  for u in a:
    assert all(src in seen for src in u.src), f"{u.op} before one of its sources"
    seen.add(u)


def test_an_end_of_several_ranges_closes_inner_first():
  r0, r1 = range_(2, 0), range_(3, 1)
  prog = sink(buf(0, 6).index(r0 * 3 + r1).store(UOp.const(1.0)).end(r0, r1))
  lin = linearize(prog)
  kinds = [(u.op, u.arg.idx if u.op is Ops.RANGE else (u.src[1].arg.idx if u.op is Ops.END else None)) for u in lin
           if u.op in (Ops.RANGE, Ops.END)]
  assert kinds == [(Ops.RANGE, 0), (Ops.RANGE, 1), (Ops.END, 1), (Ops.END, 0)]


def test_a_range_never_closed_is_an_error():
  r = range_(4, 0)
  with pytest.raises(LinearizeError, match="never closed"): linearize(sink(buf(0, 4).index(r).store(UOp.const(1.0))))
  with pytest.raises(LinearizeError, match="takes a SINK"): linearize(buf(0, 4))


def test_thread_axis_is_the_outermost_loop():
  g = buf(0, 64).reshape((8, 8)) * 2.0
  lin = linearize(lower(g, buf(1, 64), Ctx(opts=Opts(thread=1))))
  first = next(u for u in lin if u.op is Ops.RANGE)
  assert first.arg.kind is AxisType.THREAD and first.src[0].arg == 8


def test_a_value_used_only_after_a_loop_is_computed_after_it():
  """A mask read after a reduction (attention's causal mask around q @ k.T) doesn't depend on the reduction's loop, so
  it could go before or after it; before, 16 mask vectors were held across a GEMM's k loop beside its 16 accumulators
  and spilled them. What a loop needs still goes before the loop."""
  m = buf(0, 4, dtypes.bool)
  x = buf(1, 4 * 8).reshape((4, 8))
  lin = linearize(lower(m.where(x.reduce(Ops.ADD, 1), float("-inf")), buf(2, 4)))
  at = {u: i for i, u in enumerate(lin)}
  mask = next(u for u in lin if u.op is Ops.LOAD and u.dtype is dtypes.bool)
  end = next(u for u in lin if u.op is Ops.END and u.src[1].arg.kind.name == "REDUCE")
  loads_in_loop = [u for u in lin if u.op is Ops.LOAD and u.dtype is dtypes.f32 and at[u] < at[end]]
  assert at[mask] > at[end] and loads_in_loop


def _chain_depth(u: UOp) -> int:
  d = 0
  while u.src[2].op is Ops.MULACC: u, d = u.src[2], d + 1
  return d


def test_a_register_tile_of_multiply_add_chains_is_updated_step_by_step():
  """A sum over a loop of 3 and an axis of 4 unrolled whole (a convolution's channels and window), over a 2 x 2 tile: 4
  accumulators, each updated by a chain of 4 fused multiply-adds an iteration. The chains go step by step (every
  accumulator's first multiply-add, then every second one...), so that each fma's latency hides behind the other
  accumulators' (a 3x3 convolution's kernel: 3.66-3.80 -> 2.83-3.32 ms), not one chain after another; a load goes
  after the steps before the first one that reads it. Each accumulator still adds its terms in the same order."""
  M, N, R, K = 4, 4, 3, 4
  a = buf(0, M * R * K).reshape((M, 1, R, K)).expand((M, N, R, K))
  b = buf(1, N * R * K).reshape((1, N, R, K)).expand((M, N, R, K))
  lin = linearize(lower((a * b).reduce(Ops.ADD, 2), buf(2, M * N), Ctx(opts=Opts(upcast={0: 2, 1: 2}, unroll=K, fma=True))))
  chains = [u for u in lin if u.op is Ops.MULACC]
  steps = [_chain_depth(u) for u in chains]
  assert len(chains) == 16 and steps == sorted(steps) and steps.count(0) == 4
  pos = {u: i for i, u in enumerate(lin)}
  for u in chains:
    step = _chain_depth(u)
    for x in u.src[:2]:
      first = min(_chain_depth(w) for w in chains if x in w.src)
      if x.op is Ops.LOAD and first == step and step > 0:
        assert pos[x] > max(pos[w] for w in chains if _chain_depth(w) == step - 1)
