"""Every Opts choice computes the right answer: random kernels (elementwise with broadcasting, reductions over any axes,
GEMMs of odd sizes, convolutions, movement chains, gathers of rows) lowered with random valid Opts (vectors, register tiles, unrolling,
partial accumulators, fused multiply-adds, threads, cache tiles, a pad's loop split at its edges) against NumPy; elementwise kernels give the same
bits with and without threads, and so do reductions (a THREAD loop splits outputs, never a sum). A sum is compared within
a few ulps of the sum of its terms' magnitudes (its rounding error, whatever the order of the additions). The budget
is fixed for CI; UOPC_FUZZ_ITERS=N runs longer."""
import os
import numpy as np
import pytest
from hypothesis import given, settings, HealthCheck, strategies as st
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, buf, prod
from uopc.rangeify import Opts, check_opts, LowerError
from uopc.composite import pad, flip_axis
from uopc.opt import choose_opts, Caps
from uopc.kernelize import make_kernel
from uopc.testing import run_shaped

ITERS = int(os.environ.get("UOPC_FUZZ_ITERS", "60"))


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "fuzz-cache"))


# ---- random kernels: a shaped graph over BUFFERs, its inputs, and NumPy's answer -----------------------------------------

sizes = st.sampled_from([1, 2, 3, 4, 5, 7, 8, 12, 16, 17, 32, 48, 64])


@st.composite
def elementwise(draw):
  shape = tuple(draw(st.lists(sizes, min_size=1, max_size=3)))
  rng = np.random.default_rng(draw(st.integers(0, 2**16)))
  x = rng.standard_normal(shape).astype(np.float32)
  bshape = tuple(1 if draw(st.booleans()) else s for s in shape)     # broadcast along some axes
  y = rng.standard_normal(bshape).astype(np.float32)
  if draw(st.booleans()): x.ravel()[:: max(1, x.size // 3)] = np.nan
  X = buf(0, x.size).reshape(shape)
  Y = buf(1, y.size).reshape(bshape).expand(shape)
  op = draw(st.sampled_from(["add", "mul", "max", "where", "exp", "cmp", "recip"]))
  with np.errstate(all="ignore"):
    if op == "add": u, ref = X + Y, x + y
    elif op == "mul": u, ref = X * Y * 3.0, x * y * np.float32(3)
    elif op == "max": u, ref = X.maximum(Y), np.maximum(x, y)
    elif op == "where": u, ref = (X < Y).where(X, Y * 2.0), np.where(x < y, x, y * np.float32(2))
    elif op == "exp": u, ref = (X * 0.5).alu(Ops.EXP2), np.exp2(x * np.float32(0.5))
    elif op == "cmp": u, ref = (X < Y).cast(dtypes.i32) + (X.ne(Y)).cast(dtypes.i32), (x < y).astype(np.int32) + (x != y).astype(np.int32)
    else: u, ref = (X + 4.0).recip(), np.float32(1) / (x + np.float32(4))
  return "elementwise", u, [x, y], ref.astype(np.float32 if ref.dtype.kind == "f" else ref.dtype), 0.0


@st.composite
def reduction(draw):
  shape = tuple(draw(st.lists(sizes, min_size=1, max_size=3)))
  rng = np.random.default_rng(draw(st.integers(0, 2**16)))
  x = rng.standard_normal(shape).astype(np.float32)
  axes = sorted(draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)))
  keep = [a for a in range(len(shape)) if a not in axes]
  X = buf(0, x.size).reshape(shape)
  moved = X.permute(tuple(keep + axes)) if keep + axes != list(range(len(shape))) else X
  rop = draw(st.sampled_from([Ops.ADD, Ops.MAX]))
  u = moved.reduce(rop, len(axes))
  ref = x.astype(np.float64).sum(tuple(axes)) if rop is Ops.ADD else x.max(tuple(axes))
  return "reduction", u, [x], np.asarray(ref, np.float32), np.abs(x).astype(np.float64).sum(tuple(axes))


@st.composite
def gemm(draw):
  m, k, n = draw(sizes), draw(sizes), draw(sizes)
  rng = np.random.default_rng(draw(st.integers(0, 2**16)))
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  A = buf(0, m * k).reshape((m, 1, k)).expand((m, n, k))
  if draw(st.booleans()):   # B given transposed (n, k), as nn.Linear's weight: the reduced axis is contiguous in both
    B = buf(1, n * k).reshape((1, n, k)).expand((m, n, k))
    inputs = [a, np.ascontiguousarray(b.T)]
  else:
    B = buf(1, k * n).reshape((k, n)).permute((1, 0)).reshape((1, n, k)).expand((m, n, k))
    inputs = [a, b]
  return "reduction", (A * B).reduce(Ops.ADD, 1), inputs, (a.astype(np.float64) @ b).astype(np.float32), np.abs(a).astype(np.float64) @ np.abs(b)


@st.composite
def conv1d(draw):
  length, kw, ch = draw(st.integers(4, 40)), draw(st.integers(1, 4)), draw(st.sampled_from([1, 2, 4, 8]))
  rng = np.random.default_rng(draw(st.integers(0, 2**16)))
  x, w = rng.standard_normal((ch, length)).astype(np.float32), rng.standard_normal((ch, kw)).astype(np.float32)
  out = length - kw + 1
  X = buf(0, ch * length).reshape((ch, length))
  windows = UOp(Ops.STACK, tuple(X.shrink(((0, ch), (s, s + out))) for s in range(kw))).permute((1, 2, 0))   # (ch, out, kw)
  u = (windows * buf(1, ch * kw).reshape((ch, 1, kw)).expand((ch, out, kw))).reduce(Ops.ADD, 1)
  corr = lambda f: np.stack([np.correlate(f(x[c]).astype(np.float64), f(w[c]).astype(np.float64), "valid") for c in range(ch)])
  return "reduction", u, [x, w], corr(lambda v: v).astype(np.float32), corr(np.abs)


@st.composite
def movement(draw):
  shape = tuple(draw(st.lists(sizes, min_size=2, max_size=3)))
  rng = np.random.default_rng(draw(st.integers(0, 2**16)))
  x = rng.standard_normal(shape).astype(np.float32)
  u, ref = buf(0, x.size).reshape(shape), x
  for _ in range(draw(st.integers(1, 4))):
    step = draw(st.integers(0, 3))
    if step == 0:
      perm = tuple(draw(st.permutations(range(ref.ndim))))
      u, ref = u.permute(perm), ref.transpose(perm)
    elif step == 1:
      ax = draw(st.integers(0, ref.ndim - 1))
      widths = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) if a == ax else (0, 0) for a in range(ref.ndim))
      if ref.shape[ax]: u, ref = pad(u, widths), np.pad(ref, widths)
    elif step == 2:
      ax = draw(st.integers(0, ref.ndim - 1))
      u, ref = flip_axis(u, ax), np.flip(ref, ax)
    else:
      ax = draw(st.integers(0, ref.ndim - 1))
      if ref.shape[ax] > 1:
        b = draw(st.integers(0, ref.shape[ax] - 1))
        arg = tuple((b, ref.shape[ax]) if a == ax else (0, s) for a, s in enumerate(ref.shape))
        u, ref = u.shrink(arg), ref[tuple(slice(lo, hi) for lo, hi in arg)]
  if draw(st.booleans()) and ref.ndim >= 2:
    return "reduction", u.reduce(Ops.ADD, 1) * 1.0, [x], ref.astype(np.float64).sum(-1).astype(np.float32), np.abs(ref).astype(np.float64).sum(-1)
  return "elementwise", u * 1.0, [x], np.ascontiguousarray(ref), 0.0


@st.composite
def gather(draw):
  # rows of x (itself through a view sometimes) picked by a tensor of indices, then an elementwise op or a sum over the
  # rows' last axis: loads at loaded indices under every Opts
  shape = tuple(draw(st.lists(sizes, min_size=1, max_size=3)))
  rng = np.random.default_rng(draw(st.integers(0, 2**16)))
  x = rng.standard_normal(shape).astype(np.float32)
  ishape = tuple(draw(st.lists(sizes, min_size=0, max_size=2)))
  idx = rng.integers(0, shape[0], ishape).astype(np.int32)
  X, I = buf(0, x.size).reshape(shape), buf(1, max(1, idx.size), dtypes.i32).reshape(ishape)
  if len(shape) >= 2 and draw(st.booleans()):                           # rows of a transposed view
    X, x = X.permute((1, 0) + tuple(range(2, len(shape)))), x.swapaxes(0, 1)
    I, idx = buf(1, max(1, idx.size), dtypes.i32).reshape(ishape), rng.integers(0, x.shape[0], ishape).astype(np.int32)
  g, ref = (X * 2.0).gather(I), x[idx] * np.float32(2)
  if ref.ndim >= 1 and draw(st.booleans()):
    return "reduction", g.reduce(Ops.ADD, 1) * 1.0, [x if x.flags.c_contiguous else np.ascontiguousarray(x.swapaxes(0, 1)), idx], \
      ref.astype(np.float64).sum(-1).astype(np.float32), np.abs(ref).astype(np.float64).sum(-1)
  return "elementwise", g + 1.0, [x if x.flags.c_contiguous else np.ascontiguousarray(x.swapaxes(0, 1)), idx], ref + np.float32(1), 0.0


kernels = st.one_of(elementwise(), reduction(), gemm(), conv1d(), movement(), gather())


# ---- random valid Opts ---------------------------------------------------------------------------------------------------

def divisors(n: int) -> list[int]: return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def opts_for(draw, root: UOp) -> Opts:
  """Random Opts, kept only if check_opts accepts them for this kernel (a refusal draws again, up to a few times)."""
  shape = root.shape
  inner = sorted({u.src[0].shape[-1] for u in root.toposort() if u.op is Ops.REDUCE and u.arg[1] > 0})
  stacked = any(u.op is Ops.STACK for u in root.toposort())
  for _ in range(6):
    kw = {}
    if shape and draw(st.booleans()):
      ax = draw(st.integers(0, len(shape) - 1))
      kw["vector"] = (ax, draw(st.sampled_from([2, 4, 8, 16])))
    elif inner and draw(st.booleans()): kw["reduce_vector"] = draw(st.sampled_from([2, 4, 8, 16]))
    if shape and draw(st.booleans()):
      kw["upcast"] = {ax: draw(st.sampled_from(divisors(shape[ax])[:4])) for ax in draw(st.sets(st.integers(0, len(shape) - 1), max_size=2))}
    if inner and draw(st.booleans()): kw["unroll"] = draw(st.sampled_from([1, 2, 3, 4]))
    if shape and draw(st.booleans()): kw["thread"] = draw(st.integers(0, len(shape) - 1))
    if shape and draw(st.booleans()):   # one or two axes (a threads' axis tiled after another: its blocks go outermost)
      kw["tile"] = {ax: draw(st.sampled_from(divisors(shape[ax]))) for ax in draw(st.sets(st.integers(0, len(shape) - 1), min_size=1, max_size=2))}
    if len(shape) >= 2 and draw(st.booleans()):   # refused (and drawn again) for a kernel with a reduction
      ax = draw(st.integers(0, len(shape) - 2))
      kw["inner"] = {ax: draw(st.sampled_from(divisors(shape[ax])))}
    kw["fma"] = bool(inner) and draw(st.booleans())
    kw["split"] = stacked and draw(st.booleans())   # refused (and drawn again) for a kernel with a reduction
    try:
      o = Opts(**kw)
      check_opts(root, o)
      return o
    except LowerError: pass
  return Opts()


def check(kind, got, ref, scale):
  """Elementwise results are NumPy's to an ulp or two (exp2 is the C library's); a sum's error is bounded by a few ulps
  of the sum of its terms' magnitudes, whatever order it adds in."""
  if ref.dtype.kind != "f": np.testing.assert_array_equal(got, ref)
  else: np.testing.assert_allclose(got, ref, rtol=1e-6, atol=np.max(64 * np.finfo(np.float32).eps * np.asarray(scale), initial=1e-30), equal_nan=True)


@settings(max_examples=ITERS, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_kernels_under_random_opts_match_numpy(data):
  kind, root, inputs, ref, scale = data.draw(kernels)
  opts = data.draw(opts_for(root))
  got = run_shaped(root, inputs, opts=opts)
  check(kind, got, ref, scale)
  if opts.thread is not None:   # threads split the outputs: every output is computed exactly as on one thread
    single = run_shaped(root, inputs, opts=Opts(**{**opts.__dict__, "thread": None}))
    assert np.array_equal(got.view(np.uint8), single.view(np.uint8))


@settings(max_examples=ITERS // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_the_heuristics_choice_matches_numpy(data):
  kind, root, inputs, ref, scale = data.draw(kernels)
  # 16 or 32 vector registers (AVX2's, AVX-512's and AArch64's), whose register tiles differ
  # and gathers or not (a transposing copy's vectors are gathers with them: _gather_copy)
  caps = Caps(threads=2, vector_width=data.draw(st.sampled_from([4, 8, 16])), vector_registers=data.draw(st.sampled_from([16, 32])), fma=True,
              gather=data.draw(st.booleans()))
  n = max(1, prod(root.shape))
  opts = choose_opts(make_kernel(root, buf(len(inputs), n, root.dtype), canonical=False), caps)
  check(kind, run_shaped(root, inputs, opts=opts), ref, scale)


@pytest.mark.parametrize("m, k, n, vectors, thread", [(256, 64, 96, 3, 0), (256, 33, 128, 2, 0), (1024, 128, 384, 3, 0),
                                                     (96, 40, 192, 3, 0), (96, 1024, 192, 3, 1)])
def test_the_heuristics_wide_gemm_tiles_match_numpy(m, k, n, vectors, thread):
  """The register tiles of 8 rows x 3 or 2 vectors and the split of a GEMM's rows across threads where its B fits in half
  an L2 (its columns' otherwise: 1024 x 192 of B is 768 KiB, over half of Caps' default 1 MiB; the fuzzers' sizes stop at
  64 columns, before either), against NumPy."""
  opts = _heuristic_gemm_matches_numpy(m, k, n)
  assert dict(opts.upcast).get(1) == vectors and opts.thread == thread


@pytest.mark.parametrize("m, k, n, tile", [(256, 64, 96, (4, 3)), (96, 40, 128, (6, 2)), (1024, 128, 256, (4, 2)), (40, 33, 8, (8, 1))])
def test_the_heuristics_gemm_tiles_for_16_vector_registers_match_numpy(m, k, n, tile):
  """The register tiles that fit in AVX2's 16 registers (4 x 3, 6 x 2, 4 x 2 of 8 lanes; 8 rows of one vector where
  the columns are one vector), against NumPy."""
  opts = _heuristic_gemm_matches_numpy(m, k, n, Caps(threads=2, vector_width=8, fma=True))
  assert (dict(opts.upcast).get(0, 1), dict(opts.upcast).get(1, 1)) == tile and opts.vector == (1, 8)


@pytest.mark.parametrize("m, k, n", [(256, 256, 10), (40, 33, 7), (16, 64, 34)])
def test_the_heuristics_tile_of_a_scalar_reduction_matches_numpy(m, k, n):
  """A GEMM too narrow for vectors (W read down its few columns) gets a tile of its columns, a chain of multiply-adds
  each: against NumPy."""
  opts = _heuristic_gemm_matches_numpy(m, k, n)
  assert opts.vector is None and dict(opts.upcast).get(1, 1) > 1


def _heuristic_gemm_matches_numpy(m: int, k: int, n: int, caps: Caps = Caps(threads=2, vector_width=16, fma=True)) -> Opts:
  """A (m, k) @ (k, n) GEMM run with the Opts the heuristics choose on `caps`' machine (AVX-512's by default), checked
  against NumPy; the Opts."""
  rng = np.random.default_rng(m + k + n)
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  A = buf(0, m * k).reshape((m, 1, k)).expand((m, n, k))
  B = buf(1, k * n).reshape((k, n)).permute((1, 0)).reshape((1, n, k)).expand((m, n, k))
  root = (A * B).reduce(Ops.ADD, 1)
  opts = choose_opts(make_kernel(root, buf(2, m * n), canonical=False), caps)
  check("reduction", run_shaped(root, [a, b], opts=opts), (a.astype(np.float64) @ b).astype(np.float32), np.abs(a).astype(np.float64) @ np.abs(b))
  return opts


@pytest.mark.parametrize("m, k, n, threads", [(64, 40, 128, 2), (128, 64, 288, 3), (32, 16, 256, 2)])
def test_the_heuristics_gemm_of_a_packed_b_split_by_column_blocks_matches_numpy(m, k, n, threads):
  """A GEMM reading B packed into panels of 32 columns, at least as wide as it is tall, splits its columns in one block
  a thread, the threads' loop outside the row blocks (choose_opts): against NumPy."""
  rng = np.random.default_rng(m + k + n)
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  packed = np.ascontiguousarray(b.reshape(k, n // 32, 32).transpose(1, 0, 2))    # P[j // 32, k, j % 32] = B[k, j]
  A = buf(0, m * k).reshape((m, 1, k)).expand((m, n, k))
  B = buf(1, k * n).reshape((n // 32, k, 32)).permute((1, 0, 2)).reshape((k, n)).permute((1, 0)).reshape((1, n, k)).expand((m, n, k))
  root = (A * B).reduce(Ops.ADD, 1)
  caps = Caps(threads=threads, vector_width=16, fma=True, l2_bytes=8 << 20, gemm_panel=32)
  opts = choose_opts(make_kernel(root, buf(2, m * n), canonical=False), caps)
  assert opts.thread == 1 and dict(opts.tile).get(1) == n // threads, opts
  ref = (a.astype(np.float64) @ b).astype(np.float32)
  check("reduction", run_shaped(root, [a, packed], opts=opts), ref, np.abs(a).astype(np.float64) @ np.abs(b))


@pytest.mark.parametrize("k, n, panel", [(1024, 64, 8), (2048, 96, 32), (768, 48, 16)])
def test_the_heuristics_transposing_copy_matches_numpy(k, n, panel):
  """A copy into panels (P[j // panel, k, j % panel] = A[k, j]) walks blocks of rows inside each panel, the blocks split
  across the threads (the fuzzers' sizes stop before a copy long enough for it): every element lands where NumPy's
  transpose puts it."""
  a = np.random.default_rng(k + n).standard_normal((k, n)).astype(np.float32)
  root = buf(0, k * n).reshape((k, n // panel, panel)).permute((1, 0, 2))
  opts = choose_opts(make_kernel(root, buf(1, k * n), canonical=False), Caps(threads=2, vector_width=16, fma=True))
  from uopc.opt import THREAD_MIN_WORK
  assert opts.tile and opts.thread == (1 if k * n >= THREAD_MIN_WORK else None)    # a small copy: one thread, the same loops
  assert np.array_equal(run_shaped(root, [a], opts=opts), a.reshape(k, n // panel, panel).transpose(1, 0, 2))


@pytest.mark.parametrize("rows, width, tokens, registers", [(512, 64, 256, 32), (200, 48, 96, 32), (64, 32, 64, 16), (65, 128, 1024, 32)])
def test_the_heuristics_tile_a_one_hot_scatter_as_a_gemm_and_match_numpy(rows, width, tokens, registers):
  """An embedding's gradient, out[v, d] = sum over tokens t of (idx[t] == v ? g[t, d] : 0): a GEMM of the one-hot and the
  tokens' rows, whose rows are tiled as a GEMM's (each loaded vector of g feeds several rows' selects), though what moves
  along them, the positions compared with each index, is read outside the sum's loop. Against np.add.at."""
  rng = np.random.default_rng(rows + tokens)
  idx, g = rng.integers(0, rows, tokens).astype(np.int32), rng.standard_normal((tokens, width)).astype(np.float32)
  pos = np.arange(rows, dtype=np.int32)
  full = (rows, width, tokens)
  hit = buf(0, rows, dtypes.i32).reshape((rows, 1, 1)).expand(full).eq(buf(1, tokens, dtypes.i32).reshape((1, 1, tokens)).expand(full))
  rows_of_g = buf(2, tokens * width).reshape((tokens, width)).permute((1, 0)).reshape((1, width, tokens)).expand(full)
  root = hit.where(rows_of_g, rows_of_g.const_like(0.0)).reduce(Ops.ADD, 1)
  opts = choose_opts(make_kernel(root, buf(3, rows * width), canonical=False), Caps(threads=2, vector_width=16, vector_registers=registers, fma=True))
  assert opts.vector is not None and dict(opts.upcast).get(0, 1) > 1          # rows of the output x vectors of its columns
  want, scale = np.zeros((rows, width), np.float64), np.zeros((rows, width), np.float64)
  np.add.at(want, idx, g)
  np.add.at(scale, idx, np.abs(g))
  check("reduction", run_shaped(root, [pos, idx, g], opts=opts), want.astype(np.float32), scale)
