"""The C listings of the example programs (testing/example_programs.py), as a test of values (against NumPy) and of loop
structure: how many loops, which loop each accumulator lives in, which loads are hoisted. Variable numbering is not
pinned."""
import re, subprocess
import numpy as np
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, buf
from uopc.uir import parse
from uopc.symbolic import simplify
from uopc.composite import pad_axis, flip_axis, anti_eye, move_axis
from uopc.rangeify import lower, Opts, Ctx
from uopc.testing import render_c, run_c
from uopc.backends.c import MATH_DECLS, VECTORIZE_PRAGMA, CCompiler, CRenderer, scalar_loop
from uopc.vectorize import vectorize
from uopc.linearize import linearize
from uopc.testing import run_shaped
from example_programs import ROWSUM_UIR, gemm_uir, syllabus_uir, view_chain, sub_max, sub_max_through_a_flatten, neighbors, conv1d


def body(src: str, name: str) -> list[str]:
  lines = src.splitlines()
  start = next(i for i, l in enumerate(lines) if l.startswith(f"void {name}("))
  return [l.strip() for l in lines[start + 1:-1]]


def nest(src: str, name: str) -> list[tuple[tuple[str, ...], str]]:
  """Each statement of the kernel with the loop counters open around it, outermost first."""
  out, open_ = [], []
  for l in body(src, name):
    if l == "}": open_.pop(); continue
    if m := re.match(r"for \(int (ridx\d+) = 0;", l):
      out.append((tuple(open_), l)); open_.append(m.group(1)); continue
    out.append((tuple(open_), l))
  return out


def where(src: str, name: str, pattern: str) -> list[tuple[str, ...]]:
  """The loop nests of the statements matching a regex."""
  return [n for n, l in nest(src, name) if re.search(pattern, l)]


def loops(src: str, name: str) -> list[str]:
  return [re.match(r"for \(int (ridx\d+) = 0; ridx\d+ < (\d+)", l).group(0) for _, l in nest(src, name) if l.startswith("for ")]


def c_of(root: UOp, out_slot: int, name: str) -> str:
  return render_c(lower(root, buf(out_slot, max(1, int(np.prod(root.shape))), root.dtype)), name)


def test_view_chain():
  root = view_chain()
  src = c_of(root, 2, "view_chain")
  assert len(loops(src, "view_chain")) == 2
  assert "data0[((ridx0+(ridx1*4))+1)]" in src                 # the whole movement chain is one index expression
  assert where(src, "view_chain", r"data1\[ridx1\]") == [("ridx0", "ridx1")]
  a, b = np.arange(12, dtype=np.float32), np.array([1, 10, 100], np.float32)
  assert np.array_equal(run_shaped(root, [a, b]), a.reshape(3, 4).T[1:3] * b)


def test_rowsum_and_its_uir_listing():
  x = buf(0, 12).reshape((3, 4))
  sink = lower(x.reduce(Ops.ADD, 1), buf(99, 3))
  src = render_c(sink, "rowsum")
  assert "void rowsum(float* restrict data0, float* restrict data99)" in src
  assert where(src, "rowsum", r"^float acc0;") == [("ridx0",)] and where(src, "rowsum", r"^acc0 = 0\.0f;") == [("ridx0",)]
  assert where(src, "rowsum", r"data0\[") == [("ridx0", "ridx1")] and where(src, "rowsum", r"^data99\[ridx0\] = ") == [("ridx0",)]
  a = np.arange(12, dtype=np.float32)
  out = np.zeros(3, np.float32)
  run_c(sink, {0: a, 99: out})
  assert np.array_equal(out, a.reshape(3, 4).sum(1))



def test_the_seeds_lowered_rowsum_uir_runs_with_run_c():
  a = np.random.default_rng(0).standard_normal(12).astype(np.float32)
  out = np.zeros(3, np.float32)
  run_c(parse(ROWSUM_UIR), {0: a, 1: out}, "rowsum")
  np.testing.assert_allclose(out, a.reshape(3, 4).sum(1), rtol=1e-6)


def test_sub_max():
  root = sub_max()
  src = c_of(root, 1, "sub_max")
  assert loops(src, "sub_max") == ["for (int ridx0 = 0; ridx0 < 3", "for (int ridx2 = 0; ridx2 < 4", "for (int ridx1 = 0; ridx1 < 4"]
  assert where(src, "sub_max", r"^acc0 = -INFINITY;") == [("ridx0",)]          # once per row, not per element
  a = np.random.default_rng(1).standard_normal(12).astype(np.float32)
  assert np.array_equal(run_shaped(root, [a]), a.reshape(3, 4) - a.reshape(3, 4).max(1, keepdims=True))


def test_neighbors_share_one_reduce_loop():
  root = neighbors()
  src = c_of(root, 1, "neighbors")
  assert len(loops(src, "neighbors")) == 2
  assert where(src, "neighbors", r"^float acc\d;") == [("ridx0",), ("ridx0",)]
  assert len(where(src, "neighbors", r"data0\[")) == 2 and set(where(src, "neighbors", r"data0\[")) == {("ridx0", "ridx1")}
  a = np.arange(20, dtype=np.float32)
  s = a.reshape(4, 5).sum(1)
  assert np.array_equal(run_shaped(root, [a]), s[:3] + s[1:])


def test_no_simplify_and_with_simplify(monkeypatch):
  import uopc.rangeify as R
  y = sub_max_through_a_flatten()
  good = render_c(lower(y, buf(1, 16)), "with_simplify")
  monkeypatch.setattr(R, "simplify", lambda u: u)
  monkeypatch.setattr(R, "_regroup_memo", {})   # (unravels simplified by the lowering above are remembered)
  frozen = lower(y, buf(1, 16))
  monkeypatch.undo()
  bad = render_c(simplify(frozen), "no_simplify")
  assert where(good, "with_simplify", r"^acc0 = -INFINITY;") == [("ridx0",)]
  assert where(bad, "no_simplify", r"^acc0 = -INFINITY;") == [("ridx0", "ridx1")]   # without simplify: the max is recomputed per column, O(N^3)
  a = np.random.default_rng(2).standard_normal(16).astype(np.float32)
  out = np.zeros(16, np.float32)
  run_c(simplify(frozen), {0: a, 1: out})
  assert np.array_equal(out.reshape(4, 4), a.reshape(4, 4) - a.reshape(4, 4).max(1, keepdims=True))


def test_gemm():
  src = c_of(parse(gemm_uir(4)), 2, "gemm")
  assert len(loops(src, "gemm")) == 3
  assert where(src, "gemm", r"^float acc0;") == [("ridx0", "ridx1")]
  assert where(src, "gemm", r"^int alu\d+ = \(ridx0\*4\);") == [("ridx0",)]                 # A's row offset, hoisted
  assert where(src, "gemm", r"data1\[\(ridx1\+\(ridx2\*4\)\)\]") == [("ridx0", "ridx1", "ridx2")]   # B down a column


def test_syllabus_is_not_a_gemm_and_hoists_a():
  g = parse(syllabus_uir(4))
  src = c_of(g, 2, "syllabus")
  assert where(src, "syllabus", r"data0\[") == [("ridx0", "ridx1")]        # A[i, j] doesn't depend on k: outside the k loop
  assert where(src, "syllabus", r"data1\[") == [("ridx0", "ridx1", "ridx2")]


def test_conv1d():
  out = conv1d(8, 3)
  src = c_of(out, 2, "conv1d")
  assert where(src, "conv1d", r"data0\[") == [("ridx0",)] * 3 and where(src, "conv1d", r"data1\[") == [("ridx0", "ridx1")]
  res = run_shaped(out, [np.arange(8, dtype=np.float32), np.array([1, 10, 100], np.float32)])
  assert list(res) == [210., 321., 432., 543., 654., 765.]


def test_pad1d_uses_c_division_only_where_bounds_allow():
  v = buf(0, 3)
  g = pad_axis(v, 0, 1, 2)
  src = c_of(g, 1, "pad1d")
  assert len(loops(src, "pad1d")) == 1 and "floordiv_i32(" not in body(src, "pad1d")[0] and "floormod_i32(" not in "\n".join(body(src, "pad1d"))
  assert re.search(r"data0\[\(?\w*%3\)?\]|data0\[\(.*%3\)\]", "\n".join(body(src, "pad1d")))   # the speculative load stays in bounds
  a = np.array([1, 2, 3], np.float32)
  assert np.array_equal(run_shaped(g, [a]), np.pad(a, (1, 2)))


def test_flip3_with_the_anti_identity_product():
  """FLIP as a matrix-vector product with anti_eye, O(n^2) with a reduce loop."""
  x = buf(0, 3)
  n = 3
  xl = move_axis(x, 0, -1)
  xe = xl.reshape((1, n)).expand((n, n))
  y = (xe * anti_eye(n, dtypes.f32)).reduce(Ops.ADD, 1)
  src = c_of(y, 1, "flip3")
  assert len(loops(src, "flip3")) == 2 and where(src, "flip3", r"^float acc0;") == [("ridx0",)]
  assert np.array_equal(run_shaped(y, [np.array([1, 2, 3], np.float32)]), [3, 2, 1])


def test_flip_axis_is_one_loop_and_one_load():
  """Our flip_axis is the O(n) movement-op version: no reduce loop at all."""
  src = c_of(flip_axis(buf(0, 3), 0), 1, "flip")
  assert len(loops(src, "flip")) == 1 and len(where(src, "flip", r"data0\[")) == 1
  assert np.array_equal(run_shaped(flip_axis(buf(0, 5), 0), [np.arange(5, dtype=np.float32)]), np.arange(5)[::-1])


def test_flat_t():
  g = buf(0, 12).reshape((3, 4)).permute((1, 0)).reshape((12,))
  src = c_of(g, 1, "flat_t")
  assert len(loops(src, "flat_t")) == 1
  index = re.search(r"data0\[(.*)\];", src).group(1)
  assert "ridx0%3" in index and "ridx0/3" in index and "floor" not in index   # C's % and / because bounds prove ridx0 >= 0
  a = np.arange(12, dtype=np.float32)
  assert np.array_equal(run_shaped(g, [a]), a.reshape(3, 4).T.reshape(-1))


@pytest.mark.parametrize("N", [16, 33])
def test_gemm_from_movement_ops_values(N):
  a, b = np.random.default_rng(N).standard_normal((2, N, N)).astype(np.float32)
  np.testing.assert_allclose(run_shaped(parse(gemm_uir(N)), [a.ravel(), b.ravel()]), a @ b, atol=1e-4)


def linear(sink: UOp) -> list[UOp]: return linearize(vectorize(sink))   # as the C backend renders it (lanes as vectors)


def test_a_kernel_with_a_loop_of_scalar_work_on_memory_is_built_at_the_vectorizers_level():
  """CFLAGS are -Og, without gcc's loop optimizer: uopc vectorizes a kernel itself. A kernel with an innermost loop that
  loads or stores with no vector value in it (a 65-wide softmax row, a copy uopc gave no lanes) starts with
  VECTORIZE_PRAGMA, the level whose vectorizer takes such loops; a kernel whose inner loops are vectors does not, nor
  does a GEMM tile's k loop (a scalar of A broadcast against vectors of B), nor a kernel without loops."""
  x = buf(0, 65 * 8).reshape((8, 65))
  assert scalar_loop(linear(lower(x.reduce(Ops.ADD, 1), buf(1, 8))))                                   # a row's sum
  assert scalar_loop(linear(lower(x * 2.0, buf(1, 65 * 8))))                                           # no lanes
  y = buf(0, 64)
  assert not scalar_loop(linear(lower((y * 2.0).alu(Ops.EXP2), buf(1, 64), Ctx(opts=Opts(vector=(0, 8))))))
  assert not scalar_loop(linear(lower(buf(0, 1) * 2.0, buf(1, 1))))                                    # no loop at all
  gemm = parse(gemm_uir(16))
  tiled = lower(gemm, buf(2, 256), Ctx(opts=Opts(vector=(1, 8))))
  assert not scalar_loop(linear(tiled)) and VECTORIZE_PRAGMA not in render_c(tiled, "tile")


def test_a_small_kernels_scalar_loop_stays_at_cflags_level():
  """gcc's -O1 and vectorizer cost about 6 ms a kernel more than -Og: a kernel whose buffers are all smaller than
  CRenderer.scalar_loop_min elements keeps its scalar loop at -Og (a cold GPT step's small transposed Adam updates),
  and one at the threshold gets the pragma, whichever of its buffers is the large one (a softmax's rows, read)."""
  n = CRenderer.scalar_loop_min
  assert not c_of(buf(0, n // 2) * 2.0, 1, "small").startswith(VECTORIZE_PRAGMA)
  assert c_of(buf(0, n) * 2.0, 1, "large").startswith(VECTORIZE_PRAGMA)
  rows = buf(0, n).reshape((n // 64, 64)).reduce(Ops.MAX, 1)                 # reads n elements, writes n // 64
  assert scalar_loop(linear(lower(rows, buf(1, n // 64)))) and c_of(rows, 1, "rows").startswith(VECTORIZE_PRAGMA)


def test_a_large_kernel_of_vector_exp2_moves_its_loop_invariants_out():
  """-Og loads the prelude's exp2 polynomial constants again at every step of a vector loop: a kernel of vector exp2 with
  a buffer of CRenderer.scalar_loop_min elements or more (a softmax's exps) starts with MATH_PRAGMA (-O1's loop-invariant
  motion); a smaller one, or one without exp2, keeps CFLAGS' level, a lane loop (log2) and a scalar loop the
  vectorizer's; CUDA's none."""
  from uopc.backends.c import MATH_PRAGMA
  n = CRenderer.scalar_loop_min
  vec = lambda root, name: render_c(lower(root, buf(1, int(np.prod(root.shape))), Ctx(opts=Opts(vector=(0, 8)))), name)
  assert vec((buf(0, n) * 2.0).alu(Ops.EXP2), "big").startswith(MATH_PRAGMA)
  assert not vec((buf(0, n // 2) * 2.0).alu(Ops.EXP2), "small").startswith(MATH_PRAGMA)
  assert not vec(buf(0, n) * 2.0, "no_math").startswith("#pragma")
  assert vec((buf(0, n) * 2.0).alu(Ops.LOG2), "lanes").startswith(VECTORIZE_PRAGMA)
  assert c_of(buf(0, n * 2).reshape((n, 2)).alu(Ops.EXP2), 1, "scalar").startswith(VECTORIZE_PRAGMA)
  from uopc.backends.cuda import CUDARenderer
  assert CUDARenderer.math_pragma == ""
  np.testing.assert_allclose(run_shaped((buf(0, n) * 0.5).alu(Ops.EXP2), [np.linspace(-30, 30, n, dtype=np.float32)]),
                             np.exp2(np.linspace(-30, 30, n, dtype=np.float32) * 0.5), rtol=2e-6)


def test_a_kernels_helpers_are_inlined_at_cflags_level(tmp_path, monkeypatch):
  """-Og inlines no function on its own: a vector fma called per multiply-add made a GEMM's tile 2x slower. The prelude's
  helpers are always_inline, so a kernel built with CFLAGS keeps none of them as a function of its own (nm lists the
  local symbols of its shared object)."""
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path))
  x = buf(0, 64)
  src = render_c(lower(((x * 2.0).alu(Ops.EXP2) < 3.0).where(x, x * x), buf(1, 64), Ctx(opts=Opts(vector=(0, 8)))), "helped")
  helpers = [h for h in ("exp2_f32x8", "fma_f32x8", "sel_f32x8", "bcast_f32x8") if f"{h}(" in src]
  assert len(helpers) == 4 and VECTORIZE_PRAGMA not in src
  prog = CCompiler().compile(src, "helped")
  symbols = subprocess.run(["nm", str(prog.path)], capture_output=True, text=True, check=True).stdout
  assert "helped" in symbols and not [h for h in helpers if h in symbols], symbols

def test_the_prelude_holds_only_the_helpers_the_kernel_uses():
  plain = c_of(buf(0, 4) * 2.0, 1, "plain")
  assert plain.startswith("void plain(")    # no libm declarations, no helper, no vector type (nor the pragma: 4 elements)
  ex = c_of(buf(0, 4).alu(Ops.EXP2), 1, "ex")
  assert "float uopc_exp2(float x)" in ex and MATH_DECLS not in ex and "floordiv_i32" not in ex and "typedef" not in ex
  div = c_of(buf(0, 4, dtypes.i32) // buf(1, 4, dtypes.i32), 2, "div")
  assert "int floordiv_i32(int a, int b)" in div and "floormod_i32" not in div and "uopc_exp2" not in div
  mx = c_of(buf(0, 8).reshape((2, 4)).reduce(Ops.MAX, 1), 1, "mx")
  assert mx.startswith(MATH_DECLS) and "-INFINITY" in mx and "#include" not in mx   # libm declared, not included
  x = buf(0, 64)
  vec = render_c(lower((x * 2.0).alu(Ops.EXP2), buf(1, 64), Ctx(opts=Opts(vector=(0, 8)))), "vec")
  assert "typedef float f32x8 " in vec and "f32x8 exp2_f32x8(f32x8 x)" in vec and "sel_f32x8(" in vec and "bcast_f32x8(" in vec
  assert "f32x8 fma_f32x8(" in vec                                  # the polynomial's steps are fused multiply-adds
  assert vec.index("f32x8 fma_f32x8(") < vec.index("f32x8 exp2_f32x8(")   # (declared before their use)
  assert "float uopc_exp2" not in vec and "f32x16" not in vec and "i32x8_u" not in vec and "ldmask" not in vec
  for root, inputs in [(buf(0, 4).alu(Ops.EXP2), [np.zeros(4, np.float32)]), ((x * 2.0).alu(Ops.EXP2), [np.zeros(64, np.float32)])]:
    np.testing.assert_array_equal(run_shaped(root, inputs, opts=Opts(vector=(0, 4))), np.ones(root.shape, np.float32))   # it compiles
