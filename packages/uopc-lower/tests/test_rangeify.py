"""rangeify and lower: index maps, the REDUCE lowering, Opts, checked by running the lowered loops."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, AxisType, buf, range_, stack, prod
from uopc.uir import parse, to_uir
from uopc.symbolic import simplify
from uopc.composite import pad, flip_axis
from uopc.rangeify import ravel, unravel, identity, Opts, Ctx, ranges_in, rangeify, lower, merge_ends, LowerError
from uopc.linearize import linearize
from uopc.interpret import run_linear
from example_programs import ROWSUM_UIR, view_chain, sub_max_through_a_flatten, neighbors, conv1d

NP = {dtypes.f32: np.float32, dtypes.i32: np.int32, dtypes.bool: np.bool_}


def run_lowered(root: UOp, inputs: list[np.ndarray], opts: Opts | None = None) -> np.ndarray:
  """Lower root into BUFFER slot len(inputs) and run it with the loop interpreter."""
  n = max(1, prod(root.shape))
  sink = lower(root, buf(len(inputs), n, root.dtype), Ctx(opts=opts or Opts()))
  bufs = {i: [x.item() for x in np.asarray(a).ravel()] for i, a in enumerate(inputs)}
  bufs[len(inputs)] = [0] * n
  run_linear(linearize(sink), bufs)
  out = bufs[len(inputs)]
  return np.array(out[:prod(root.shape)], dtype=NP[root.dtype]).reshape(root.shape)


def test_ravel_unravel():
  i, j = range_(4, 0), range_(6, 1)
  assert simplify(ravel((i, j), (4, 6))) is i * 6 + j
  assert tuple(simplify(x) for x in unravel(ravel((i, j), (4, 6)), (4, 6))) == (i, j)
  assert tuple(simplify(x) for x in unravel(ravel((i, j), (4, 6)), (24, 1))) == (i * 6 + j, UOp.const(0))
  k = range_(4, 2)
  merged = ravel((i, range_(4, 1), k), (4, 4, 4))
  assert simplify(unravel(merged, (4, 16))[0]) is i


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=2, max_size=5), st.data())
def test_a_splits_index_is_the_simplified_unravel(sizes, data):
  """A RESHAPE that splits one axis reads its source at the simplified row-major position of the index (a shortcut):
  the very node that simplifying unravel's (position // 1) % n gives, for index entries that are loop counters, offsets
  of them, a constant 0 or a sum of two counters; and no shortcut where the bounds don't show the position in range."""
  from uopc.rangeify import _regrouped, _split_position
  n = prod(sizes)
  ranges = [range_(s, k) for k, s in enumerate(sizes)]
  def entry(k):
    kind = data.draw(st.sampled_from(["range", "zero", "offset", "pair"] if sizes[k] > 1 else ["zero"]))
    if kind == "zero": return UOp.const(0)
    if kind == "offset": return range_(sizes[k] - 1, 10 + k) + 1
    if kind == "pair":                    # two counters whose sum stays within the axis: 0 .. size - 2
      h = data.draw(st.integers(1, sizes[k] - 1))
      return range_(h, 20 + k) + range_(sizes[k] - h, 30 + k)
    return ranges[k]
  idx = tuple(entry(k) for k in range(len(sizes)))
  general = tuple(simplify(c) for c in unravel(ravel(idx, tuple(sizes)), (n,)))
  assert _regrouped(idx, tuple(sizes), (n,)) == general
  short = _split_position(idx, tuple(sizes), n)
  assert short is None or (short,) == general
  if all(i.op is Ops.RANGE or i.op is Ops.CONST for i in idx): assert short is not None
  wide = tuple(range_(s + 1, 40 + k) for k, s in enumerate(sizes))      # a counter past its axis: not within [0, n)
  assert _split_position(wide, tuple(sizes), n) is None


def test_identity_elements():
  assert identity(Ops.ADD, dtypes.f32) == 0.0 and identity(Ops.ADD, dtypes.i32) == 0
  assert identity(Ops.MAX, dtypes.f32) == -float("inf") and identity(Ops.MAX, dtypes.i32) == -2**31


def test_index_flow_of_the_view_chain():
  root = view_chain()
  ctx = Ctx()
  i, j = ctx.rng(2), ctx.rng(3)
  load = rangeify(root.src[0], (i, j), ctx)             # the transposed rows, before the multiply
  assert load is buf(0, 12).index(simplify(i + j * 4 + 1)).load()
  a = np.arange(12, dtype=np.float32)
  b = np.array([1, 10, 100], np.float32)
  assert np.array_equal(run_lowered(root, [a, b]), a.reshape(3, 4).T[1:3] * b)


def test_rangeify_memo_shares_work():
  x = buf(0, 4)
  ctx = Ctx()
  i = ctx.rng(4)
  v = rangeify(x * x, (i,), ctx)
  assert v.src[0] is v.src[1]                     # one load, used twice
  assert (x, (i,)) in ctx.memo and rangeify(x, (i,), ctx) is v.src[0]


def test_rowsum_lowering_has_the_three_afters():
  x = buf(0, 12).reshape((3, 4))
  sink = lower(x.reduce(Ops.ADD, 1), buf(99, 3))
  nodes = sink.toposort()
  alloc = [u for u in nodes if u.op is Ops.ALLOC]
  assert len(alloc) == 1
  afters = [u for u in nodes if u.op is Ops.AFTER]
  acc0 = next(u for u in afters if u.src[0] is alloc[0])
  r0 = next(u for u in nodes if u.op is Ops.RANGE and u.arg.kind is AxisType.LOOP)
  r1 = next(u for u in nodes if u.op is Ops.RANGE and u.arg.kind is AxisType.REDUCE)
  assert acc0.src[1:] == (r0,)                                        # lives in the output loop
  assert any(u.src[0] is acc0 and r1 in u.src[1:] and any(s.op is Ops.STORE for s in u.src) for u in afters)   # after init, in the loop
  assert any(u.src[0] is acc0 and u.src[1].op is Ops.END for u in afters)                                      # after the loop
  a = np.arange(12, dtype=np.float32)
  assert np.array_equal(run_lowered(x.reduce(Ops.ADD, 1), [a]), a.reshape(3, 4).sum(1))



def test_the_seeds_lowered_rowsum_runs():
  sink = parse(ROWSUM_UIR)
  a = np.arange(12, dtype=np.float32)
  mem = {0: list(map(float, a)), 1: [0.0] * 3}
  run_linear(linearize(sink), mem)
  assert mem[1] == list(a.reshape(3, 4).sum(1))
  assert parse(to_uir(sink)) is sink


def test_unrolled_copies_share_one_reduce_loop():
  z = neighbors()
  sink = lower(z, buf(1, 3))
  reduce_ranges = [u for u in sink.toposort() if u.op is Ops.RANGE and u.arg.kind is AxisType.REDUCE]
  assert len(reduce_ranges) == 1 and len([u for u in sink.toposort() if u.op is Ops.ALLOC]) == 2
  assert len([u for u in sink.toposort() if u.op is Ops.END and u.src[1] is reduce_ranges[0]]) == 1   # merge_ends
  a = np.arange(20, dtype=np.float32)
  s = a.reshape(4, 5).sum(1)
  assert np.array_equal(run_lowered(z, [a]), s[:3] + s[1:])


def test_merge_ends_merges_duplicate_ends():
  r = range_(4, 0)
  b = buf(0, 4)
  e1, e2 = b.index(r).store(UOp.const(1.0)).end(r), b.index(r).store(UOp.const(2.0)).end(r)
  merged = merge_ends(UOp(Ops.SINK, (e1, e2)))
  ends = [u for u in merged.toposort() if u.op is Ops.END]
  assert len(ends) == 1 and ends[0].src[0].op is Ops.SINK


def test_reshape_indices_are_simplified_before_a_reduce_sees_them():
  y = sub_max_through_a_flatten()
  ctx = Ctx()
  i, j = ctx.rng(4), ctx.rng(4)
  rangeify(y, (i, j), ctx)
  [(rnode, rngs)] = list(ctx.reduce_ranges)
  assert rngs == frozenset({i})     # the accumulator depends on the row only, so it sits outside the column loop


def test_stack_index_and_composites():
  a = np.arange(6, dtype=np.float32)
  x = buf(0, 6).reshape((2, 3))
  s = UOp(Ops.STACK, (x, x * 2.0, x + 1.0))
  assert np.array_equal(run_lowered(s, [a]), np.stack([a.reshape(2, 3), a.reshape(2, 3) * 2, a.reshape(2, 3) + 1]))
  assert np.array_equal(run_lowered(s.index(UOp.const(2), UOp.const(1)), [a]), a.reshape(2, 3)[1] + 1)
  assert np.array_equal(run_lowered(pad(x, ((1, 2), (3, 0))), [a]), np.pad(a.reshape(2, 3), ((1, 2), (3, 0))))
  assert np.array_equal(run_lowered(flip_axis(x, 1), [a]), a.reshape(2, 3)[:, ::-1])
  st = stack(buf(0, 6).index(UOp.const(0)), buf(0, 6).index(UOp.const(5)))
  assert np.array_equal(run_lowered(st, [a]), a[[0, 5]])



def test_a_reshape_past_i32_that_keeps_its_leading_axes_lowers():
  """flip_axis of an (m, n) tensor views it as (m, n * n) on the way: more than i32 elements in all when m * n * n is
  (2048 x 1024 x 1024), but the RESHAPE keeps m and regroups only n * n, each group's flat position computed on its own
  (rangeify's _reshaped): it lowers, and only a group past i32 is refused (test_hostile)."""
  from uopc.rangeify import _largest_group
  assert _largest_group((2048, 1024, 1024), (2048, 1 << 20)) == 1 << 20 and _largest_group((4, 6), (4, 6)) == 0
  assert _largest_group((2, 3, 1, 4), (6, 4)) == 6 and _largest_group((1 << 16, 1 << 16), (1 << 8, 1 << 24)) == 1 << 32
  m, n = 2048, 1024
  lower(flip_axis(buf(0, m * n).reshape((m, n)), 1), buf(1, m * n))            # was a LowerError: 2^31 elements

def test_conv1d_from_movement_ops():
  out = conv1d(8, 3)
  xv, wv = np.arange(8, dtype=np.float32), np.array([1, 10, 100], np.float32)
  assert list(run_lowered(out, [xv, wv])) == [210., 321., 432., 543., 654., 765.]
  assert np.array_equal(run_lowered(out, [xv, wv]), np.convolve(xv, wv[::-1], "valid"))


def _permute(rng, u, ref):
  p = tuple(int(v) for v in rng.permutation(ref.ndim))
  return u.permute(p), ref.transpose(p)

def _shrink(rng, u, ref):
  window = []
  for size in ref.shape:
    lo = int(rng.integers(0, size))
    window.append((lo, int(rng.integers(lo + 1, size + 1))))
  return u.shrink(tuple(window)), ref[tuple(slice(lo, hi) for lo, hi in window)]

def _broadcast_new_axis(rng, u, ref):
  if ref.ndim >= 4: return u, ref
  return u.reshape((1,) + u.shape).expand((2,) + u.shape), np.broadcast_to(ref[None], (2,) + ref.shape)

def _flatten(rng, u, ref): return u.reshape((ref.size,)), ref.reshape(-1)

def _reduce_last(rng, u, ref):
  if ref.ndim < 2: return u, ref
  if rng.integers(2): return u.reduce(Ops.ADD, 1), ref.astype(np.float64).sum(-1).astype(np.float32)
  return u.reduce(Ops.MAX, 1), ref.max(-1)

def _stack_doubled(rng, u, ref):
  if ref.ndim >= 4: return u, ref
  return UOp(Ops.STACK, (u, u * 2.0)), np.stack([ref, ref * np.float32(2)])

def _index_first(rng, u, ref):
  if ref.ndim < 2: return u, ref
  i = int(rng.integers(ref.shape[0]))
  return u.index(UOp.const(i)), ref[i]

STEPS = [_permute, _shrink, _broadcast_new_axis, _flatten, _reduce_last, _stack_doubled, _index_first]


def random_chain(rng: np.random.Generator, steps: int = 6):
  """A (2, 3, 4) buffer through random steps (movement ops, REDUCE ADD/MAX, STACK, INDEX), each applied to the UOp and
  to a NumPy array alike; NumPy is the oracle."""
  data = rng.standard_normal(24).astype(np.float32)
  u, ref = buf(0, 24).reshape((2, 3, 4)), data.reshape(2, 3, 4)
  for _ in range(steps): u, ref = STEPS[int(rng.integers(len(STEPS)))](rng, u, ref)
  return u, data, ref


@pytest.mark.parametrize("seed", range(30))
def test_random_movement_chains(seed):
  u, x, ref = random_chain(np.random.default_rng(seed))
  np.testing.assert_allclose(run_lowered(u, [x]), ref, rtol=1e-5, atol=1e-5)


OPTS = [Opts(upcast={0: 2}), Opts(unroll=2), Opts(upcast={1: 4}, unroll=4), Opts(thread=0), Opts(tile={0: 4, 1: 4}),
        Opts(tile={0: 4}, upcast={0: 2}, thread=1)]

@pytest.mark.parametrize("opts", OPTS, ids=[repr(o) for o in OPTS])
def test_opts_change_the_loops_not_the_values(opts):
  N = 8
  a, b = np.random.default_rng(1).standard_normal((2, N, N)).astype(np.float32)
  lhs = buf(0, N * N).reshape((N, 1, N)).expand((N, N, N))
  rhs = buf(1, N * N).reshape((N, N)).permute((1, 0)).reshape((1, N, N)).expand((N, N, N))
  g = (lhs * rhs).reduce(Ops.ADD, 1)
  np.testing.assert_allclose(run_lowered(g, [a, b], opts), a @ b, rtol=1e-4, atol=1e-5)
  m = buf(0, N * N).reshape((N, N))
  sm = (m - m.reduce(Ops.MAX, 1).reshape((N, 1)).expand((N, N)))
  np.testing.assert_allclose(run_lowered(sm, [a], opts), a - a.max(1, keepdims=True))


def test_upcast_unrolls_without_new_ranges():
  g = buf(0, 16).reshape((4, 4)) * 2.0
  sink = lower(g, buf(1, 16), Ctx(opts=Opts(upcast={1: 4})))
  assert [r.src[0].arg for r in ranges_in(sink)] == [4]
  assert len([u for u in sink.toposort() if u.op is Ops.STORE]) == 4


def test_gpu_axes_are_global_and_local_ranges():
  g = buf(0, 64).reshape((8, 8)) + 1.0
  sink = lower(g, buf(1, 64), Ctx(opts=Opts(gpu=True, local={1: 4})))
  kinds = sorted(r.arg.kind.name for r in ranges_in(sink))
  assert kinds == ["GLOBAL", "GLOBAL", "LOCAL"]
  with pytest.raises(LowerError, match="not divisible"): lower(g, buf(1, 64), Ctx(opts=Opts(gpu=True, local={1: 3})))


def test_zero_size_outputs_lower_to_nothing():
  g = buf(0, 4).shrink(((2, 2),)) * 2.0
  assert lower(g, buf(1, 1)) is UOp(Ops.SINK, ())
  e = buf(0, 4).reshape((4, 1)).shrink(((0, 4), (0, 0))).reduce(Ops.ADD, 1)   # a sum over nothing is 0
  assert np.array_equal(run_lowered(e, [np.ones(4, np.float32)]), np.zeros(4, np.float32))


def test_scalar_outputs_and_full_reductions():
  a = np.arange(12, dtype=np.float32)
  assert run_lowered(buf(0, 12).reshape((3, 4)).reduce(Ops.ADD, 2), [a]) == a.sum()
  assert run_lowered(buf(0, 12).reduce(Ops.MAX, 1), [a]) == 11.0
  assert run_lowered(UOp.const(3.0), []) == 3.0


def test_lower_errors():
  g = buf(0, 4) * 2.0
  with pytest.raises(LowerError, match="output must be a BUFFER"): lower(g, buf(1, 4).index(0))
  with pytest.raises(LowerError, match="output BUFFER is dtypes.i32"): lower(g, buf(1, 4, dtypes.i32))
  with pytest.raises(LowerError, match="has 3 elements"): lower(g, buf(1, 3))
  with pytest.raises(LowerError, match="Opts.upcast"): lower(g, buf(1, 4), Ctx(opts=Opts(upcast={3: 2})))
  with pytest.raises(LowerError, match="no index rule for Ops.LOAD"): lower(buf(0, 4).index(0).load().reshape((1,)), buf(1, 1))


def test_deep_shaped_chain_lowers_without_recursion():
  x = buf(0, 4)
  c = x
  for _ in range(20_000): c = c + 1.0
  sink = lower(c, buf(1, 4))
  assert sink.op is Ops.SINK
  mem = {0: [0.0, 1.0, 2.0, 3.0], 1: [0.0] * 4}
  run_linear(linearize(sink), mem)
  assert mem[1] == [20000.0, 20001.0, 20002.0, 20003.0]


# ---- long float sums accumulate in chunks ----------------------------------------------------------------------------

def reduce_loops(sink: UOp) -> list[int]:
  return [r.src[0].arg for r in sorted((u for u in sink.toposort() if u.op is Ops.RANGE and u.arg.kind is AxisType.REDUCE), key=lambda r: r.arg)]


def test_a_long_float_sum_adds_partial_sums_over_chunks_then_its_tail_as_the_evaluator_does():
  # one f32 accumulator for 2**24 + 8197 terms stops growing at 2**24 (uopc run of a sum of 2**25 ones printed 16777216)
  from uopc.evaluate import SUM_CHUNK, to_python
  x = np.array([2.0**24] + [1.0] * (2 * SUM_CHUNK + 5), np.float32)
  root = buf(0, x.size).reduce(Ops.ADD, 1)
  sink = lower(root, buf(1, 1))
  assert reduce_loops(sink) == [2, SUM_CHUNK, 6] and sum(u.op is Ops.ALLOC for u in sink.toposort()) == 2   # chunks, steps, tail
  got = run_lowered(root, [x])
  lit = UOp(Ops.STACK, tuple(UOp.const(float(v)) for v in x))
  assert got.item() == to_python(lit.reduce(Ops.ADD, 1)) == 2.0**24 + SUM_CHUNK          # the evaluator's order, bit for bit
  # with lanes and unrolled steps, each lane's steps are chunked: 8193 steps of 4 lanes * 2 are 2 chunks and a last step
  ones = np.ones(2 * SUM_CHUNK * 4 * 2 + 8, np.float32)
  lanes = lower(buf(0, ones.size).reduce(Ops.ADD, 1), buf(1, 1), Ctx(opts=Opts(reduce_vector=4, unroll=2)))
  assert reduce_loops(lanes) == [2, SUM_CHUNK]
  assert run_lowered(buf(0, ones.size).reduce(Ops.ADD, 1), [ones], Opts(reduce_vector=4, unroll=2)).item() == ones.size


def test_short_sums_integer_sums_and_maxima_keep_one_accumulator():
  from uopc.evaluate import SUM_CHUNK
  for root in (buf(0, SUM_CHUNK).reduce(Ops.ADD, 1), buf(0, 3 * SUM_CHUNK, dtypes.i32).reduce(Ops.ADD, 1), buf(0, 3 * SUM_CHUNK).reduce(Ops.MAX, 1)):
    sink = lower(root, buf(1, 1, root.dtype))
    assert reduce_loops(sink) == [root.src[0].shape[0]] and sum(u.op is Ops.ALLOC for u in sink.toposort()) == 1


# (source shape, output shape, simplify calls): one per source coordinate of a merged or split group of axes; an axis kept
# in place or of size 1 takes none (ravelling every axis and simplifying each coordinate back took one per source axis)
RESHAPES = [((4, 6), (4, 2, 3), 1), ((2, 3, 4), (6, 4), 2), ((2, 3, 4), (2, 12), 2), ((1, 6, 1), (2, 3), 1),
            ((6,), (1, 2, 1, 3, 1), 1), ((4, 6), (6, 4), 2), ((2, 1, 3), (3, 2), 3), ((8, 4, 3), (2, 4, 4, 3), 1),
            ((5,), (5,), 0), ((2, 6), (3, 4), 2)]


@pytest.mark.parametrize("old, new, simplified", RESHAPES)
def test_a_reshape_maps_each_group_of_axes_on_its_own_and_passes_a_kept_axis_through(old, new, simplified, monkeypatch):
  """A RESHAPE's source index, computed per group of axes whose sizes match on both sides, is the row-major position read
  back in the source's shape at every index; an axis both shapes keep in place passes its index through untouched,
  with no division or modulo to simplify away (the calls to simplify are counted)."""
  import uopc.rangeify as R
  calls = []
  monkeypatch.setattr(R, "simplify", lambda u: calls.append(u) or simplify(u))
  monkeypatch.setattr(R, "_regroup_memo", {})   # (no unravel remembered from an earlier lowering)
  idx = tuple(range_(s, k) for k, s in enumerate(new))
  got = R.INDEX_MAPS[Ops.RESHAPE](buf(0, prod(old)).reshape(old).reshape(new), idx)
  assert len(got) == len(old) and len(calls) == simplified
  for point in np.ndindex(*new):
    at = {r: UOp.const(int(v)) for r, v in zip(idx, point)}
    assert tuple(simplify(c.substitute(at)).arg for c in got) == np.unravel_index(np.ravel_multi_index(point, new), old), point



def test_an_unravel_remembered_from_an_earlier_kernel_is_the_one_computed_afresh(monkeypatch):
  """The unravels of a reshape's groups are remembered across lowerings (a kernel of the same shapes asks for them
  again): lowering with every answer remembered gives the program lowering from nothing gives, node for node, and the
  memo keeps at most UNRAVELED answers, the oldest dropped first."""
  import uopc.rangeify as R
  monkeypatch.setattr(R, "_regroup_memo", {})
  programs = [(buf(0, prod(old)).reshape(old).reshape(new) * 2.0, buf(1, prod(new))) for old, new, _ in RESHAPES]
  fresh = [lower(x, out) for x, out in programs]
  assert len(R._regroup_memo) > 0
  assert [lower(x, out) for x, out in programs] == fresh                        # every unravel remembered
  monkeypatch.setattr(R, "_regroup_memo", {})
  monkeypatch.setattr(R, "UNRAVELED", 3)
  assert [lower(x, out) for x, out in programs] == fresh and len(R._regroup_memo) == 3
  last = programs[-1][0].src[0]
  idx = tuple(range_(s, k) for k, s in enumerate(last.shape))
  R.INDEX_MAPS[Ops.RESHAPE](last, idx)
  assert (idx, last.shape, last.src[0].shape) in R._regroup_memo                   # the newest is kept

def test_split_cuts_the_last_loop_where_a_concatenation_changes_branch():
  """Opts.split: a pad of 1 on each side of a (3, 8) array's last axis is three pieces of the last loop, one step of
  zeros, 8 steps of x at a plain index (no div or mod: the branch and its index are simplified from the piece's bounds),
  one step of zeros; the rows' padding stays a select per row. The values are the unsplit program's. With vector lanes
  and copies (a 3-way concatenation of 32-element rows, 8 lanes x 2) the pieces are whole steps of the loop."""
  x = np.arange(24, dtype=np.float32).reshape(3, 8)
  g = pad(buf(0, 24).reshape((3, 8)), ((1, 1), (1, 1)))
  sink = lower(g, buf(1, 50), Ctx(opts=Opts(split=True)))
  inner = [r for r in sink.toposort() if r.op is Ops.RANGE and r.arg.idx > 0]
  assert sorted(r.src[0].arg for r in inner) == [8]               # the middle piece loops; the edges are one step each
  loads = [u.src[0].src[1] for u in sink.toposort() if u.op is Ops.LOAD]
  divmods = [n for i in loads for n in i.toposort() if n.op in (Ops.FLOORDIV, Ops.FLOORMOD)]
  assert divmods and not any(inner[0] in n.toposort() for n in divmods)     # the rows' (r0's) remain, none of the piece's
  np.testing.assert_array_equal(run_lowered(g, [x], Opts(split=True)), np.pad(x, 1))
  np.testing.assert_array_equal(run_lowered(g, [x], Opts(split=True)), run_lowered(g, [x]))
  parts = [buf(k, 4 * 32).reshape((4, 32)) for k in range(3)]
  cat = pad(parts[0], ((0, 0), (0, 64))) + pad(parts[1], ((0, 0), (32, 32))) + pad(parts[2], ((0, 0), (64, 0)))
  xs = [np.random.default_rng(k).standard_normal((4, 32)).astype(np.float32) for k in range(3)]
  for o in (Opts(split=True), Opts(split=True, upcast={1: 2}), Opts(split=True, thread=0, upcast={0: 2})):
    np.testing.assert_array_equal(run_lowered(cat, xs, o), np.concatenate(xs, 1))


@pytest.mark.parametrize("root, opts, says", [
  (buf(0, 12).reshape((3, 4)) * 2.0, Opts(split=True), "no concatenation"),
  (pad(buf(0, 12).reshape((3, 4)), ((0, 0), (1, 1))).reduce(Ops.ADD, 1), Opts(split=True), "reduction keeps its loops"),
  (pad(buf(0, 12).reshape((3, 4)), ((0, 0), (2, 2))), Opts(split=True, thread=1), "threads' loop or tiled"),
  (pad(buf(0, 12).reshape((3, 4)), ((0, 0), (2, 2))), Opts(split=True, tile={1: 4}), "threads' loop or tiled")])
def test_check_opts_refuses_a_split_that_cant_apply(root, opts, says):
  with pytest.raises(LowerError, match=f"Opts.split: .*{says}"): lower(root, buf(1, max(1, prod(root.shape))), Ctx(opts=opts))


def test_inner_walks_an_axis_in_blocks_whose_steps_go_inside_the_innermost_loop():
  # x.T (8 x 16 from 16 x 8) with axis 0's blocks of 4 innermost: ranges in nesting order are axis 0's blocks, axis 1,
  # then the block's steps; every output once, in any combination with threads, tiles, lanes and a split concatenation
  x = np.arange(128, dtype=np.float32).reshape(16, 8)
  t = buf(0, 128).reshape((16, 8)).permute((1, 0)) * 1.0
  sink = lower(t, buf(1, 128), Ctx(opts=Opts(inner={0: 4})))
  assert [r.src[0].arg for r in sorted(ranges_in(sink), key=lambda r: r.arg)] == [2, 16, 4]
  for o in (Opts(inner={0: 4}), Opts(inner={0: 2}, thread=1, tile={1: 8}), Opts(inner={0: 4}, upcast={1: 2}), Opts(inner={0: 4}, vector=(1, 4))):
    np.testing.assert_array_equal(run_lowered(t, [x], o), x.T)
  cube = buf(0, 128).reshape((2, 16, 4)).permute((0, 2, 1)) + 1.0
  np.testing.assert_array_equal(run_lowered(cube, [x], Opts(inner={1: 2}, thread=0)), x.reshape(2, 16, 4).transpose(0, 2, 1) + 1)
  parts = [buf(k, 16 * 8).reshape((16, 8)).permute((1, 0)) for k in range(3)]
  cat = pad(parts[0], ((0, 0), (0, 32))) + pad(parts[1], ((0, 0), (16, 16))) + pad(parts[2], ((0, 0), (32, 0)))
  xs = [np.random.default_rng(k).standard_normal((16, 8)).astype(np.float32) for k in range(3)]
  for o in (Opts(split=True, inner={0: 4}), Opts(split=True, inner={0: 2}, upcast={1: 2}), Opts(split=True, inner={0: 2}, vector=(1, 4))):
    sink = lower(cat, buf(3, 8 * 48), Ctx(opts=o))
    assert len([r for r in ranges_in(sink) if r.src[0].arg == o.inner[0][1]]) == 3     # each piece its own steps' loop
    np.testing.assert_array_equal(run_lowered(cat, xs, o), np.concatenate([a.T for a in xs], 1))


@pytest.mark.parametrize("root, opts, says", [
  (buf(0, 12).reshape((3, 4)) * 2.0, Opts(inner={1: 2}), "no loop after it"),
  (buf(0, 12).reshape((4, 3)) * 2.0, Opts(inner={0: 2}, thread=1), "no loop after it"),
  (buf(0, 12).reshape((4, 3)) * 2.0, Opts(inner={0: 3}), "3 must divide axis 0 of size 4"),
  (buf(0, 12).reshape((4, 3)) * 2.0, Opts(inner={0: 4}), "strictly between 1 and it"),
  (buf(0, 16).reshape((4, 4)) * 2.0, Opts(inner={0: 2}, upcast={0: 2}), "upcast or the vector's"),
  (buf(0, 16).reshape((4, 4)) * 2.0, Opts(inner={0: 2}, thread=0), "threads' loop or tiled"),
  (buf(0, 16).reshape((4, 4)) * 2.0, Opts(inner={0: 2}, tile={0: 2}), "threads' loop or tiled"),
  (buf(0, 64).reshape((4, 4, 4)).reduce(Ops.ADD, 1), Opts(inner={0: 2}), "reduction keeps its loops")])
def test_check_opts_refuses_an_inner_axis_that_cant_apply(root, opts, says):
  with pytest.raises(LowerError, match=f"Opts.inner: .*{says}"): lower(root, buf(1, max(1, prod(root.shape))), Ctx(opts=opts))


# ---- GATHER: a load at a loaded index ---------------------------------------------------------------------------------

GATHER_CASES = [((10, 7), (2, 3)), ((10,), (5,)), ((9, 16), (33,)), ((6, 3, 4), (2, 2)), ((5, 8), ())]

@pytest.mark.parametrize("xshape,ishape", GATHER_CASES)
@pytest.mark.parametrize("opts", [Opts(), Opts(upcast=((0, 2),)), Opts(thread=0)], ids=["plain", "upcast", "thread"])
def test_a_gather_lowers_to_loads_at_the_loaded_rows_and_matches_numpy(xshape, ishape, opts):
  rng = np.random.default_rng(3)
  a = rng.standard_normal(xshape).astype(np.float32)
  idx = rng.integers(0, xshape[0], ishape).astype(np.int32)
  x, i = buf(0, a.size).reshape(xshape), buf(1, max(1, idx.size), dtypes.i32).reshape(ishape)
  g = x.gather(i)
  if opts.upcast and (not g.shape or g.shape[0] % 2): opts = Opts()
  assert np.array_equal(run_lowered(g, [a, idx], opts), a[idx])
  # of a computed value, at computed indices
  want = (a * 2 + 1)[(xshape[0] - 1) - idx]
  assert np.array_equal(run_lowered((x * 2.0 + 1.0).gather(i * -1 + (xshape[0] - 1)), [a, idx], opts), want)


@pytest.mark.parametrize("opts", [Opts(), Opts(upcast=((1, 2),)), Opts(thread=0)], ids=["plain", "upcast", "thread"])
def test_a_batched_gather_picks_within_each_batch_entry_and_matches_take_along_axis(opts):
  rng = np.random.default_rng(8)
  a = rng.standard_normal((4, 6, 3)).astype(np.float32)
  idx = rng.integers(0, 6, (4, 2, 3)).astype(np.int32)                         # entries along axis 1, per (batch, column)
  x, i = buf(0, a.size).reshape((4, 6, 3)).permute((0, 2, 1)), buf(1, idx.size, dtypes.i32).reshape((4, 2, 3)).permute((0, 2, 1))
  got = run_lowered(x.gather(i, 2).permute((0, 2, 1)), [a, idx], opts)
  assert np.array_equal(got, np.take_along_axis(a, idx, 1))


def test_a_gathers_row_is_clamped_into_its_axis_so_every_address_is_proven_inside_memory():
  # the index is a loaded value whose bounds are all of i32; the clamp bounds the row to 0..n-1, so every address of x
  # lies inside it (out-of-range indices are the caller's to refuse: 99 reads the last row, -5 the first, and -2^31,
  # whose negation wraps, the last, instead of memory outside x)
  from uopc.symbolic import bounds
  a = np.arange(12, dtype=np.float32)
  x, i = buf(0, 12).reshape((4, 3)), buf(1, 4, dtypes.i32)
  reads = [u for u in linearize(lower(x.gather(i), buf(2, 12))) if u.op is Ops.INDEX and u.src[0].op is Ops.BUFFER and u.src[0].arg.slot == 0]
  assert reads and all(0 <= bounds(u.src[1])[0] and bounds(u.src[1])[1] <= 11 for u in reads)
  idx = np.array([1, 99, -5, -2**31], np.int32)
  assert np.array_equal(run_lowered(x.gather(i), [a, idx]), a.reshape(4, 3)[[1, 3, 0, 3]])
