"""Vector code (an UPCAST range made vector values by uopc.vectorize and printed as GCC vectors, Opts.vector /
reduce_vector / fma): the compiled kernel computes what the scalar program computes, bit for bit. Two oracles run the
same lowered program with its lanes as a plain loop: the C backend on a machine without vectors (vector_width=1: the
pass leaves the lanes as a loop), and uopc.interpret (exact where the evaluator's scalar functions are the C library's:
everything but the transcendentals), which also runs the vectorized program."""
import dataclasses
import numpy as np
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, buf
from uopc.rangeify import Opts, Ctx, lower, LowerError
from uopc.linearize import linearize
from uopc.vectorize import vectorize
from uopc.interpret import run_linear
from uopc.backends import BackendError, register_backend
from uopc.backends.c import CBackend
from uopc.testing import render_c
from uopc.runtime import np_dtype
from uopc.testing import run_shaped


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path / "cache"))


class LanesAsLoops(CBackend):
  """The C backend on a machine without SIMD vectors: uopc.vectorize leaves UPCAST lanes as a loop."""
  name = "LANES-AS-LOOPS"

  def __init__(self):
    super().__init__()
    self.caps = dataclasses.replace(self.caps, vector_width=1)


register_backend("LANES-AS-LOOPS", LanesAsLoops)


def interpreted(root: UOp, inputs: list[np.ndarray], opts: Opts, vectors: bool = False) -> np.ndarray:
  n = max(1, int(np.prod(root.shape)))
  mem = {i: a.ravel().tolist() for i, a in enumerate(inputs)}
  mem[len(inputs)] = [None] * n
  sink = lower(root, buf(len(inputs), n, root.dtype), Ctx(opts=opts))
  run_linear(linearize(vectorize(sink) if vectors else sink), mem)
  out = np.array([0 if v is None else v for v in mem[len(inputs)]], dtype=np_dtype(root.dtype))
  return out[:int(np.prod(root.shape))].reshape(root.shape)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
  if a.dtype != b.dtype or a.shape != b.shape: return False
  if a.dtype.kind != "f": return np.array_equal(a, b)
  return bool(np.all((a.view(np.uint32 if a.dtype == np.float32 else np.uint16) == b.view(a.view(np.uint32).dtype if a.dtype == np.float32
                                                                                        else np.uint16)) | (np.isnan(a) & np.isnan(b))))


rng = np.random.default_rng(0)
F = lambda *shape: rng.standard_normal(shape).astype(np.float32)
I = lambda *shape: rng.integers(-20, 20, shape).astype(np.int32)


def gemm(m, k, n):
  a, b = buf(0, m * k).reshape((m, 1, k)), buf(1, k * n).reshape((k, n)).permute((1, 0)).reshape((1, n, k))
  return (a.expand((m, n, k)) * b.expand((m, n, k))).reduce(Ops.ADD, 1), [F(m, k), F(k, n)]


def gemm_nt(m, k, n):   # x @ w.T with w (n, k): the reduced axis is contiguous in both operands
  a, b = buf(0, m * k).reshape((m, 1, k)), buf(1, n * k).reshape((1, n, k))
  return (a.expand((m, n, k)) * b.expand((m, n, k))).reduce(Ops.ADD, 1), [F(m, k), F(n, k)]


def softmax(r, c):
  x = buf(0, r * c).reshape((r, c))
  e = ((x - x.reduce(Ops.MAX, 1).reshape((r, 1)).expand((r, c))) * 1.4426950408889634).alu(Ops.EXP2)
  return e * e.reduce(Ops.ADD, 1).reshape((r, 1)).expand((r, c)).recip(), [F(r, c)]


def nan_max(r, c):
  x = F(r, c)
  x[1, 3] = np.nan; x[2, 0] = np.nan; x[0, 5] = np.inf
  return buf(0, r * c).reshape((r, c)).reduce(Ops.MAX, 1), [x]


def masked(r, c):
  x, y = buf(0, r * c).reshape((r, c)), buf(1, r * c).reshape((r, c))
  return (x > 0.0).where(x, y * 2.0).maximum(y), [F(r, c), F(r, c)]


def stored_mask(r, c):
  """A mask read from memory (bytes: an attention's causal mask): 16 lanes widen in one instruction (ldmask), 8 one by one."""
  m, x = buf(0, r * c, dtypes.bool).reshape((r, c)), buf(1, r * c).reshape((r, c))
  return m.where(x, -np.inf) + m.cast(dtypes.f32), [np.random.default_rng(3).random((r, c)) < 0.5, F(r, c)]


def integer(r, c):
  x = buf(0, r * c, dtypes.i32).reshape((r, c))
  return ((x // 3) * 3 + x % -5 + x // 7).cast(dtypes.f32) * 0.5, [I(r, c)]


def compare(r, c):
  x, y = buf(0, r * c).reshape((r, c)), buf(1, r * c).reshape((r, c))
  return (x < y) * (y.ne(0.5)), [F(r, c), F(r, c)]


def to_int(r, c):
  x = F(r, c) * np.float32(1e9)
  x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, -3e9
  return buf(0, r * c).reshape((r, c)).cast(dtypes.i32), [x]


def transposed(r, c):
  return (buf(0, r * c).reshape((r, c)).permute((1, 0)) + 1.0), [F(r, c)]


def column_sum(r, c):
  return buf(0, r * c).reshape((r, c)).permute((1, 0)).reduce(Ops.ADD, 1), [F(r, c)]


def sqrt_and_mask(r, c):
  x = F(r, c) * np.float32(4) - np.float32(1)
  x[0, :6] = [-0.0, np.inf, -np.inf, np.nan, 1e-45, 3e-39]     # -0.0 stays -0.0, negatives are NaN, subnormals round
  return buf(0, r * c).reshape((r, c)).alu(Ops.SQRT) + (buf(0, r * c).reshape((r, c)) < 0.5).cast(dtypes.f32), [x]


def gathered(r, c):
  """Copies that read across their last axis: x.T, x.T flipped along it, and int32 x.T."""
  from uopc.composite import flip_axis
  x = buf(0, r * c).reshape((r, c)).permute((1, 0))
  xi = buf(1, r * c, dtypes.i32).reshape((r, c)).permute((1, 0))
  return (x + 1.0 + flip_axis(x, 1) * 2.0) + (xi * 3).cast(dtypes.f32), [F(r, c), rng.integers(-9, 9, (r, c)).astype(np.int32)]


CASES = [
  (gathered, (32, 64), [Opts(vector=(1, 16)), Opts(vector=(1, 16), inner={0: 16}), Opts(vector=(1, 16), tile={1: 16}, thread=1, inner={0: 8}),
                        Opts(vector=(1, 8), inner={0: 4}), Opts(inner={0: 16})]),
  (gemm, (8, 16, 32), [Opts(vector=(1, 16)), Opts(vector=(1, 8), upcast={0: 2, 1: 2}, fma=True), Opts(vector=(1, 4), thread=0, fma=True),
                        Opts(vector=(0, 4)), Opts(vector=(1, 8), tile={1: 16}, thread=1, fma=True), Opts(reduce_vector=8, unroll=2, fma=True)]),
  (gemm_nt, (8, 32, 8), [Opts(reduce_vector=16, fma=True), Opts(reduce_vector=8, unroll=2, upcast={0: 2, 1: 2}, fma=True), Opts(vector=(1, 8))]),
  (softmax, (4, 32), [Opts(vector=(1, 16)), Opts(reduce_vector=16), Opts(reduce_vector=8, unroll=2), Opts(vector=(0, 4))]),
  (nan_max, (4, 16), [Opts(reduce_vector=16), Opts(reduce_vector=4, unroll=2), Opts(vector=(0, 4))]),
  (masked, (4, 16), [Opts(vector=(1, 16)), Opts(vector=(0, 4), upcast={1: 2})]),
  (stored_mask, (4, 32), [Opts(vector=(1, 16)), Opts(vector=(1, 16), upcast={1: 2}), Opts(vector=(1, 8))]),
  (integer, (4, 16), [Opts(vector=(1, 16)), Opts(vector=(0, 2))]),
  (compare, (4, 16), [Opts(vector=(1, 8))]),
  (to_int, (4, 8), [Opts(vector=(1, 8))]),
  (transposed, (8, 16), [Opts(vector=(1, 8)), Opts(vector=(0, 4))]),
  (column_sum, (16, 8), [Opts(reduce_vector=4), Opts(vector=(0, 8))]),
  (sqrt_and_mask, (4, 16), [Opts(vector=(1, 16)), Opts(vector=(1, 8)), Opts(vector=(1, 4)), Opts(vector=(0, 2))]),
]


@pytest.mark.parametrize("make, shape, opts", [(m, s, o) for m, s, os in CASES for o in os],
                         ids=[f"{m.__name__}-{i}" for m, s, os in CASES for i in range(len(os))])
def test_vector_code_computes_what_the_scalar_program_computes_bit_for_bit(make, shape, opts):
  root, inputs = make(*shape)
  got = run_shaped(root, inputs, opts=opts)
  assert same_bits(got, run_shaped(root, inputs, backend="LANES-AS-LOOPS", opts=opts))
  transcendental = any(u.op in (Ops.EXP2, Ops.LOG2, Ops.SIN) for u in root.toposort())
  if not transcendental:
    assert same_bits(got, interpreted(root, inputs, opts))
    assert same_bits(got, interpreted(root, inputs, opts, vectors=True))      # the interpreter runs the vector program too


def test_a_square_root_and_a_masks_cast_are_whole_vector_operations():
  """A square root on 4, 8 or 16 lanes is one vsqrtps (gcc's x86 builtin; sqrtf lane by lane elsewhere), a mask cast to
  f32 is an and with 1.0f's bits: no lane loop, so the kernel needs nothing of gcc's vectorizer (no VECTORIZE_PRAGMA)."""
  root, _ = sqrt_and_mask(4, 16)
  for w, builtin in ((16, "__builtin_ia32_sqrtps512_mask"), (8, "__builtin_ia32_sqrtps256"), (4, "__builtin_ia32_sqrtps(")):
    src = render_c(lower(root, buf(1, 64), Ctx(opts=Opts(vector=(1, w)))))
    assert f"sqrt_f32x{w}(" in src and builtin in src and "for (int _l" not in src and "#pragma" not in src
    assert f"&(i32x{w})bcast_f32x{w}(1.0f))" in src


def test_lanes_read_evenly_apart_load_as_one_gather_and_nothing_else_loads_them():
  """A VECTORIZE of 16 loads of one buffer, stride apart (x.T's lanes), is one gather (AVX-512's vgatherdps, lane by lane
  elsewhere and under AddressSanitizer) with no scalar load of its lanes left, f32 and i32; lanes whose addresses are
  not proven evenly apart (x.T flipped, a modulo of each lane's position) are loaded one by one as before."""
  root, _ = gathered(32, 64)
  src = render_c(lower(root, buf(2, 2048), Ctx(opts=Opts(vector=(1, 16)))))
  assert src.count("gather_f32x16(data0+") == 1 and src.count("gather_i32x16(data1+") == 1 and "data1[" not in src
  assert src.count("data0[") == 16 and "__builtin_ia32_gathersiv16sf" in src and "!defined(__SANITIZE_ADDRESS__)" in src
  assert "gather_" not in render_c(lower(root, buf(2, 2048), Ctx(opts=Opts(vector=(1, 8)))))    # 8 lanes: moved one by one


def test_a_store_to_the_buffer_between_the_lanes_loads_and_their_vector_keeps_the_lanes_loads():
  from uopc.backends.cprelude import gathers
  b = buf(0, 64)
  loads = [b.index(UOp.const(4 * c)).load() for c in range(16)]
  vec = UOp(Ops.VECTORIZE, tuple(loads))
  store = b.index(UOp.const(1)).store(UOp.const(2.0))
  assert gathers([b, *loads, vec]) == {vec: (loads[0].src[0], 4)}
  assert gathers([b, *loads, store, vec]) == {}
  assert gathers([b, *loads[:1], store, *loads[1:], vec]) == {}
  uneven = UOp(Ops.VECTORIZE, tuple(loads[:15]) + (b.index(UOp.const(61)).load(),))
  assert gathers([b, *uneven.src, uneven]) == {}


def test_a_large_sums_outputs_are_stored_past_the_caches_and_fenced():
  """A sum of products (a GEMM) whose output has CRenderer.stream_min_bytes or more stores its 16-lane vectors with
  streaming stores (stream_f32x16: AVX-512's vmovntps; ordinary stores elsewhere and under AddressSanitizer), fenced
  before the kernel returns, and computes the same values; a smaller output, one the kernel reads, or vectors of 8
  lanes (half a line), ordinary stores."""
  from uopc.backends.c import CRenderer
  k, n = 8, 2048
  m = CRenderer.stream_min_bytes // (4 * n)          # an f32 output of just the threshold's size
  a, b = F(m, k), F(k, n)
  g = (buf(0, m * k).reshape((m, 1, k)).expand((m, n, k)) * buf(1, k * n).reshape((k, n)).permute((1, 0)).reshape((1, n, k)).expand((m, n, k)))
  g = g.reduce(Ops.ADD, 1)
  opts = Opts(vector=(1, 16), upcast={0: 4, 1: 2}, fma=True, thread=0)
  src = render_c(lower(g, buf(2, m * n), Ctx(opts=opts)), "g")
  assert src.count("stream_f32x16(data2+") == 8 and "__builtin_ia32_movntps512" in src and src.rstrip().endswith("stream_fence();\n}")
  np.testing.assert_allclose(run_shaped(g, [a, b], opts=opts), a @ b, rtol=1e-5, atol=1e-5)
  small = g.shrink(((0, m // 2), (0, n)))
  assert "stream_" not in render_c(lower(small, buf(2, m * n // 2), Ctx(opts=opts)), "g")
  assert "stream_" not in render_c(lower(g + buf(2, m * n).reshape((m, n)), buf(2, m * n), Ctx(opts=opts)), "g")   # reads its output
  assert "stream_" not in render_c(lower(g, buf(2, m * n), Ctx(opts=Opts(vector=(1, 8), upcast={0: 4}, fma=True))), "g")   # 8 lanes


def test_sixteen_stored_bools_load_as_one_widening_move():
  root, _ = stored_mask(4, 32)
  src = render_c(lower(root, buf(2, 128), Ctx(opts=Opts(vector=(1, 16)))))
  assert "ldmask_i32x16(data0+" in src and "-(int)data0[" not in src


def test_a_vector_kernel_moves_whole_vectors_and_fuses_multiply_adds():
  root, _ = gemm(8, 16, 32)
  src = render_c(lower(root, buf(2, 256), Ctx(opts=Opts(vector=(1, 16), upcast={1: 2}, fma=True))), "g")
  assert "typedef float f32x16" in src and "f32x16 acc0;" in src
  assert src.count("(*(f32x16_u*)(data1+") == 2 and src.count("*(f32x16_u*)(data2+") == 2      # B rows and C: vector moves
  assert src.count("fma_f32x16(") == 2 + 1 and "__builtin_ia32_vfmaddps512_mask" in src        # two uses, one definition
  assert "for (long ridx" in src and "i32x16 ridx" not in src       # the lanes are no loop, and no index vector is computed


def test_vector_opts_that_do_not_fit_are_refused():
  root, _ = gemm(8, 16, 24)
  for opts, msg in [(Opts(vector=(1, 16)), "16 lanes \\* upcast 1 do not divide axis 1 of size 24"),
                    (Opts(vector=(1, 3)), "lanes must be a power of two"),
                    (Opts(reduce_vector=32), "32 lanes \\* unroll 1 do not divide the reduced axis of size 16"),
                    (Opts(vector=(1, 8), reduce_vector=4), "one vector axis"),
                    (Opts(vector=(2, 4)), "there is no axis 2")]:
    with pytest.raises(LowerError, match=msg): lower(root, buf(2, 8 * 24), Ctx(opts=opts))
  with pytest.raises(LowerError, match="no f32 sum"): lower(buf(0, 4) * 2.0, buf(1, 4), Ctx(opts=Opts(fma=True)))


def test_f16_values_are_not_vectorized():
  x = buf(0, 16, dtypes.f16)
  with pytest.raises(BackendError, match="f16 values are never vectorized"):
    render_c(lower(x + x, buf(1, 16, dtypes.f16), Ctx(opts=Opts(vector=(0, 8)))), "h")


def test_mulacc_compiles_to_the_evaluators_single_rounding():
  """fmaf in C and the evaluator's exact fused multiply-add agree bit for bit, ties and subnormals included."""
  from uopc.evaluate import exec_alu
  n = 4096
  a, b = F(n) * np.float32(2.0) ** rng.integers(-30, 30, n).astype(np.float32), F(n)
  c = (-(a.astype(np.float64) * b)).astype(np.float32) + F(n) * np.float32(1e-6)
  a[:64], b[:64], c[:64] = np.float32(1 + 2**-12), np.float32(1 + 2**-12), F(64) * np.float32(1e-18)    # ties that c decides
  x, y, z = buf(0, n), buf(1, n), buf(2, n)
  got = run_shaped(UOp(Ops.MULACC, (x, y, z)), [a, b, c])
  want = np.array([exec_alu(Ops.MULACC, dtypes.f32, float(p), float(q), float(r)) for p, q, r in zip(a, b, c)], np.float32)
  assert same_bits(got, want)


@pytest.mark.parametrize("opts", [Opts(vector=(0, 2)), Opts(vector=(0, 8)), Opts(vector=(0, 16))])
def test_a_mask_lane_becomes_one_not_minus_one(opts):
  """Vector comparisons give masks (-1 true); casting a lane to int must give 1. Found by the Opts fuzzer: gcc 12 at -O2
  folded (mask[l] != 0) into mask[l], so (x < y).cast(i32) was -1."""
  x, y = F(16), F(16)
  X, Y = buf(0, 16), buf(1, 16)
  got = run_shaped((X < Y).cast(dtypes.i32) + X.ne(Y).cast(dtypes.f32).cast(dtypes.i32), [x, y], opts=opts)
  np.testing.assert_array_equal(got, (x < y).astype(np.int32) + (x != y).astype(np.int32))


@pytest.mark.parametrize("opts", [Opts(), Opts(vector=(0, 16)), Opts(vector=(0, 8)), Opts(vector=(0, 4))])
def test_exp2_is_within_an_ulp_and_ieee_at_the_edges(opts):
  """uopc_exp2 (a polynomial, the same operations on every lane) against the exact 2**x."""
  x = np.concatenate([np.linspace(-150, 127.99, 1 << 16, dtype=np.float32), rng.uniform(-1, 1, 1 << 14).astype(np.float32),
                      np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 128.0, 200.0, -149.0, -150.0, -151.0, 1e30, -1e30, 0.5, -126.5] + [0.0] * 2,
                               np.float32)])
  got = run_shaped(buf(0, x.size).alu(Ops.EXP2), [x], opts=opts)
  with np.errstate(over="ignore"):
    exact = np.exp2(x.astype(np.float64))
    want32 = exact.astype(np.float32)
  finite = np.isfinite(want32) & (want32 > 0)
  assert np.max(np.abs(got[finite] - exact[finite]) / np.spacing(want32[finite])) < 1.0   # (0.93: in two roundings a step, 1.2)
  edges = got[-16:]
  assert np.isnan(edges[0]) and edges[1] == np.inf and edges[2] == 0 and edges[3] == edges[4] == 1 and edges[5] == edges[6] == np.inf
  assert edges[7] == np.float32(2.0 ** -149) and edges[8] == 0 and edges[9] == 0 and edges[10] == np.inf and edges[11] == 0
  assert edges[12] == np.float32(np.sqrt(2)) and edges[13] == np.float32(2 ** -126.5)


def test_exp2_on_vectors_clamps_its_argument_with_one_max_and_one_min():
  """exp2's clamp to [-160, 160] on a vector is x86's max then min, each of which returns x where it is NaN (the
  selects it replaced were six instructions); the values are the scalar uopc_exp2's (the test above, every width)."""
  for w, builtin in ((16, "__builtin_ia32_maxps512_mask"), (8, "__builtin_ia32_maxps256"), (4, "__builtin_ia32_maxps(")):
    src = render_c(lower(buf(0, 64).alu(Ops.EXP2), buf(1, 64), Ctx(opts=Opts(vector=(0, w)))))
    assert f"x = clamp160_f32x{w}(x);" in src and builtin in src and "x < -160.0f" not in src.split(f"exp2_f32x{w}(f32x{w} x)")[-1]


def test_exp2_on_avx512_rounds_and_scales_with_one_instruction_each_for_the_same_bits():
  """With AVX-512 a vector exp2 rounds x with vrndscaleps and makes p * 2**t with vscalefps (13 instructions where the
  1.5 * 2**23 trick and two factors from exponent bits were 22): the scalar uopc_exp2's bits on every lane (checked
  over all 2**32 floats when it was written; here over a dense sweep with the subnormal results and the edges), at 16
  lanes (AVX-512F) and 8 and 4 (its VL extension), and the old operations wherever the compiler targets neither."""
  x = np.concatenate([np.linspace(-165, 165, 1 << 16, dtype=np.float32), np.linspace(-151, -125, 1 << 14, dtype=np.float32),
                      rng.uniform(-1, 1, 1 << 12).astype(np.float32),
                      np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 127.5, 128.0, -149.5, -150.0, 1e30, -1e30])])
  scalar = run_shaped(buf(0, x.size).alu(Ops.EXP2), [x], opts=Opts())
  for w, macro, builtins in ((16, "__AVX512F__", ("__builtin_ia32_rndscaleps_mask(", "__builtin_ia32_scalefps512_mask(")),
                             (8, "__AVX512VL__", ("__builtin_ia32_rndscaleps_256_mask(", "__builtin_ia32_scalefps256_mask(")),
                             (4, "__AVX512VL__", ("__builtin_ia32_rndscaleps_128_mask(", "__builtin_ia32_scalefps128_mask("))):
    src = render_c(lower(buf(0, 64).alu(Ops.EXP2), buf(1, 64), Ctx(opts=Opts(vector=(0, w)))))
    helper = src.split(f"exp2_f32x{w}(f32x{w} x) {{")[1].split("\n}\n")[0]
    assert all(b in helper for b in builtins) and f"defined({macro})" in helper and "12582912.0f" in helper.split("#else")[1]
    assert same_bits(run_shaped(buf(0, x.size).alu(Ops.EXP2), [x], opts=Opts(vector=(0, w))), scalar), w


def test_exp2_at_or_below_minus_150_is_plus_zero_without_an_underflowing_scaling():
  """From x <= -150 down, 2**x rounds to +0: every exp2 gives it so without scaling into an underflow, which x86 cores
  run in a microcode assist (a causal softmax's masked half, exp of -inf, took 20x its other half). On AVX-512 the
  scaling is masked to the lanes above -150 or NaN (a masked lane raises nothing); elsewhere 2**n is left 1 there and +0
  selected; the scalar returns early. The bits are the scalar's at every width, and +0 (not -0) at and below -150."""
  from uopc.backends.cprelude import EXP2_SCALAR
  assert "if (x <= -150.0f) return 0.0f;" in EXP2_SCALAR
  x = np.float32([-np.inf, -1e30, -160.0, -151.0, -150.25, -150.0, -149.99, -149.75, -149.5, -126.0, np.nan])
  scalar = run_shaped(buf(0, x.size).alu(Ops.EXP2), [x], opts=Opts())
  assert same_bits(scalar[:6], np.zeros(6, np.float32)) and (scalar[6:-1] > 0).all() and np.isnan(scalar[-1])
  for w, mask in ((16, "__builtin_ia32_cmpps512_mask(x, bcast_f32x16(-150.0f), 6,"), (8, "__builtin_ia32_cmpps256_mask(x, bcast_f32x8(-150.0f), 6,"),
                  (4, "__builtin_ia32_cmpps128_mask(x, bcast_f32x4(-150.0f), 6,")):
    src = render_c(lower(buf(0, 64).alu(Ops.EXP2), buf(1, 64), Ctx(opts=Opts(vector=(0, w)))))
    helper = src.split(f"exp2_f32x{w}(f32x{w} x) {{")[1].split("\n}\n")[0]
    assert mask in helper and f"(f32x{w}){{}}, " in helper and f"i32x{w} live = (x > -150.0f) | (x != x);" in helper.split("#else")[-1]
    xs = np.resize(x, 64)
    assert same_bits(run_shaped(buf(0, 64).alu(Ops.EXP2), [xs], opts=Opts(vector=(0, w))), np.resize(scalar, 64)), w


def test_exp2_steps_are_fused_multiply_adds_and_the_gpu_emulator_computes_the_same_bits():
  """The polynomial's steps are fmaf (one rounding each) in the scalar and the vector helper, and uopc.backends.python
  (the GPU emulator) rounds each step once too, exactly: its _fma_f32 against the evaluator's exact rational fma, on
  random operands and on a sum a hair below an f32 tie (which a double rounded to nearest puts on the tie, and f32
  then rounds up: twice rounded), and its exp2 against the C backend's, bit for bit."""
  from uopc.backends.cprelude import EXP2_SCALAR
  from uopc.backends.python import _exp2, _fma_f32
  from uopc.evaluate import _fma_f32 as exact_fma
  assert EXP2_SCALAR.count("__builtin_fmaf(p, f, ") == 6 and "p*f" not in EXP2_SCALAR
  g = np.random.default_rng(7)
  a, b, c = (g.standard_normal(3000).astype(np.float32) * np.float32(4.0) for _ in range(3))
  # 2**-24 (1 + 2**-18) * (1 - 2**-18) + (1 + 2**-23) is 1 + 3 * 2**-24 - 2**-60: below the tie between 1 + 2**-23 and
  # 1 + 2**-22, so it rounds down; a double rounds it onto the tie first, and the tie goes to the even 1 + 2**-22
  tie = [(2.0 ** -24 * (1 + 2.0 ** -18), 1 - 2.0 ** -18, 1 + 2.0 ** -23), (-2.0 ** -24 * (1 + 2.0 ** -18), 1 - 2.0 ** -18, -1 - 2.0 ** -23)]
  edges = tie + [(3e38, 10.0, -3e38), (0.0, -0.0, 0.0), (-1e-8, 1e-8, 1e-30), (np.inf, 0.0, 1.0), (np.nan, 1.0, 1.0)]
  a, b, c = (np.concatenate([v, np.float32([e[k] for e in edges])]) for k, v in enumerate((a, b, c)))
  with np.errstate(invalid="ignore"): got = _fma_f32(a, b, c)
  want = np.array([exact_fma(float(x), float(y), float(z)) for x, y, z in zip(a, b, c)], np.float32)
  assert same_bits(got, want)
  assert got[3000] == np.float32(1 + 2.0 ** -23) and got[3001] == -np.float32(1 + 2.0 ** -23)
  x = np.concatenate([np.linspace(-150, 127.99, 1 << 15, dtype=np.float32), g.uniform(-1, 1, 1 << 14).astype(np.float32),
                      np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 200.0, -149.0])])
  assert same_bits(_exp2(x), run_shaped(buf(0, x.size).alu(Ops.EXP2), [x], opts=Opts()))


def test_chains_of_multiply_adds_compile_with_wrapping_indices_and_a_gemm_tile_without():
  """A convolution's unrolled window makes each accumulator a chain of multiply-adds; gcc makes 1.4-1.9x faster code for
  it when indices wrap (#pragma GCC optimize wrapv), and 1.6x slower code for a GEMM's tile. Both compute the same."""
  # out[i, j] = sum over 8 channels c and a window of 9 w of x[c, w, i, j] * k[c, w], lanes along j, the window
  # unrolled: what a 3x3 convolution's kernel is
  x = buf(0, 8 * 9 * 4 * 16).reshape((8, 9, 4, 16)).permute((2, 3, 0, 1))
  k = buf(1, 8 * 9).reshape((1, 1, 8, 9)).expand((4, 16, 8, 9))
  conv = (x * k).reduce(Ops.ADD, 2)
  opts = Opts(vector=(1, 16), unroll=9, fma=True)
  window = render_c(lower(conv, buf(2, 64), Ctx(opts=opts)))
  tile, _ = gemm(8, 16, 32)
  gemm_src = render_c(lower(tile, buf(2, 8 * 32), Ctx(opts=Opts(vector=(1, 16), upcast={0: 4}, fma=True))))
  assert window.startswith('#pragma GCC optimize ("wrapv")') and "#pragma GCC optimize" not in gemm_src
  # ...and both hold their counters and index arithmetic in 64-bit longs (a wrapping 32-bit index is recomputed and
  # sign-extended at every load; at -Og, without gcc's induction-variable passes, so is the GEMM's), a kernel without
  # multiply-adds its ints
  assert "for (long ridx" in window and "long alu" in window and "for (long ridx" in gemm_src and "long alu" in gemm_src
  assert "long" not in render_c(lower(tile.src[0], buf(2, 8 * 32 * 16), Ctx(opts=Opts(vector=(2, 16)))))
  X, K = F(8 * 9 * 4 * 16), F(8 * 9)
  assert same_bits(run_shaped(conv, [X, K], opts=opts), run_shaped(conv, [X, K], backend="LANES-AS-LOOPS", opts=opts))


def test_a_chain_kernel_with_long_indices_computes_wrapping_i32_values_as_ints_do():
  """In a kernel of multiply-add chains the i32 values are longs (see above), yet every value is what 32-bit ints give:
  an i32 ADD or MUL that may leave i32 wraps through unsigned ints, floor division and max of in-range values stay in
  range. The window's weights here come from i32 arithmetic that wraps (k * 99991 + k, past 2**31) and floor division
  of it, against the interpreter bit for bit."""
  x = buf(0, 8 * 9 * 4 * 16).reshape((8, 9, 4, 16)).permute((2, 3, 0, 1))
  ki = buf(1, 8 * 9, dtypes.i32)
  wrapped = ki * 99991 + ki
  w = wrapped.alu(Ops.FLOORDIV, 7).alu(Ops.MAX, wrapped).cast(dtypes.f32) * 2.0 ** -31
  conv = (x * w.reshape((1, 1, 8, 9)).expand((4, 16, 8, 9))).reduce(Ops.ADD, 2)
  opts = Opts(vector=(1, 16), unroll=9, fma=True)
  src = render_c(lower(conv, buf(2, 64), Ctx(opts=opts)))
  assert "for (long ridx" in src and "(unsigned)" in src
  X = F(8 * 9 * 4 * 16)
  K = np.random.default_rng(3).integers(-2**31, 2**31, 8 * 9, endpoint=False).astype(np.int32)
  got = run_shaped(conv, [X, K], opts=opts)
  assert same_bits(got, interpreted(conv, [X, K], opts))
  assert same_bits(got, run_shaped(conv, [X, K], backend="LANES-AS-LOOPS", opts=opts))


def test_a_tile_of_multiply_add_chains_is_rendered_step_by_step_and_computes_the_same():
  """Two rows of a convolution-like kernel (as above, a tile of 2 accumulators, each a chain of 9 multiply-adds an
  iteration): each multiply-add is a statement of its own, in the linearizer's order, the accumulators' steps taking
  turns (pasted into one expression, each chain would be one accumulator's after the other's, whatever the order).
  The values are the interpreter's and the lanes-as-loops backend's, bit for bit."""
  x = buf(0, 8 * 9 * 4 * 16).reshape((8, 9, 4, 16)).permute((2, 3, 0, 1))
  k = buf(1, 8 * 9).reshape((1, 1, 8, 9)).expand((4, 16, 8, 9))
  conv = (x * k).reduce(Ops.ADD, 2)
  opts = Opts(vector=(1, 16), upcast={0: 2}, unroll=9, fma=True)
  src = render_c(lower(conv, buf(2, 64), Ctx(opts=opts)))
  steps = [l.strip() for l in src.splitlines() if "fma_f32x16(" in l and "static inline" not in l]
  # (each chain's last step is pasted into the accumulator's store: acc0 = fma_f32x16(...))
  assert len(steps) == 18 and all(l.count("fma_f32x16(") == 1 for l in steps)
  assert all(l.startswith("f32x16 alu") for l in steps[:16]) and all(l.startswith("acc") for l in steps[16:])
  made = [l.split()[1] if l.startswith("f32x16") else l.split()[0] for l in steps]
  onto = [l.rsplit(", ", 1)[1].rstrip(");") for l in steps]
  assert all(onto[i + 1] != made[i] for i in range(len(steps) - 1))    # no step goes straight onto the one before it
  X, K = F(8 * 9 * 4 * 16), F(8 * 9)
  got = run_shaped(conv, [X, K], opts=opts)
  assert same_bits(got, interpreted(conv, [X, K], opts))
  assert same_bits(got, run_shaped(conv, [X, K], backend="LANES-AS-LOOPS", opts=opts))


def test_a_reduction_prefetches_the_vector_streams_that_step_a_cache_line_or_more():
  # the GEMM's B rows are 64 floats apart (256 bytes a step of k): prefetched prefetch_bytes ahead (4096: 16 steps),
  # each of its two vector loads; the scalar A loads and the stores are not
  from uopc.backends.c import CRenderer
  ahead = CRenderer.prefetch_bytes // 256 * 64
  root, inputs = gemm(8, 16, 64)
  opts = Opts(vector=(1, 16), upcast={1: 2}, fma=True)
  src = render_c(lower(root, buf(2, 8 * 64), Ctx(opts=opts)), "g")
  lines = src.splitlines()
  prefetches = [l.strip() for l in lines if "__builtin_prefetch" in l]
  assert len(prefetches) == 2 and all(p.startswith("__builtin_prefetch(data1+") and p.endswith(f"+{ahead});") for p in prefetches)
  loop = next(i for i, l in enumerate(lines) if "for (long ridx" in l and "< 16;" in l)
  assert all(loop < i for i, l in enumerate(lines) if "__builtin_prefetch" in l)
  # dot products by 16 lanes step one line a step: each operand's stream is prefetched prefetch_bytes / 64 steps ahead
  nt, _ = gemm_nt(4, 64, 8)
  assert render_c(lower(nt, buf(2, 32), Ctx(opts=Opts(reduce_vector=16))), "d").count(f"+{CRenderer.prefetch_bytes // 4});") == 2
  # what it computes is unchanged: the program as the interpreter runs it
  assert same_bits(run_shaped(root, inputs, opts=opts), interpreted(root, inputs, opts))


@pytest.mark.parametrize("program, opts, why", [
  (lambda: gemm(8, 16, 8), Opts(vector=(1, 8), fma=True), "B's rows 8 floats apart: two steps share a cache line"),
  (lambda: gemm_nt(4, 64, 8), Opts(reduce_vector=8), "x @ w.T read as dot products by 8 lanes: 32 bytes a step"),
  (lambda: softmax(4, 64), Opts(vector=(1, 16)), "its reductions' loads are scalar"),
])
def test_no_prefetch_where_a_stream_steps_less_than_a_line_or_is_scalar(program, opts, why):
  root, inputs = program()
  src = render_c(lower(root, buf(len(inputs), int(np.prod(root.shape))), Ctx(opts=opts)), "p")
  assert "__builtin_prefetch" not in src, why

