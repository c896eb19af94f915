"""GPU lowering (uopc.gpulower, rangeify with Opts(gpu=True)) on the PYTHON backend's emulated grid against NumPy; its
race detection; the WMMA fragment tables; the CUDA renderer and nvcc; the CUDA backend on a machine without a GPU."""
import shutil, subprocess, sys
import numpy as np
import pytest
from uopc.uop import UOp, Ops, buf
from uopc.dtype import dtypes
from uopc.rangeify import Opts, Ctx, lower, LowerError, gemm_pattern, gemm_form
from uopc.opt import choose_opts
from uopc.linearize import linearize
from uopc.gpulower import wmma_a, wmma_b, wmma_c
from uopc.symbolic import simplify
from uopc.backends import get_backend, LinearProgram, check_memory_safety
from uopc.backends.python import RaceError, wmma
from uopc.backends import cuda
from uopc.backends.cuda import CUDARenderer, CUDACompiler, NoDeviceError, device_available
from uopc.runtime import program_buffers, vectorized, compile_kernel
from uopc.testing import run_lowered
from uopc.kernelize import make_kernel
from uopc.dtype import AddrSpace
from uopc.testing import run_shaped
import nvcc_batch

PY = "PYTHON"


def rand(seed, *shape, dtype=np.float32):
  return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def matmul(M, N, K, dtype=dtypes.f32, batch=None):
  """A shaped GEMM over BUFFERs 0 (M x K, or batch x M x K) and 1 (K x N), as kernelize hands it over: a sum over the
  last axis of a broadcast product (f16 operands are cast to f32 first)."""
  lead = (batch,) if batch else ()
  a = buf(0, (batch or 1) * M * K, dtype).reshape(lead + (M, 1, K)).expand(lead + (M, N, K))
  b = buf(1, K * N, dtype).reshape((K, N)).permute((1, 0)).reshape((1,) * len(lead) + (1, N, K)).expand(lead + (M, N, K))
  if dtype is dtypes.f16: a, b = a.cast(dtypes.f32), b.cast(dtypes.f32)
  return (a * b).reduce(Ops.ADD, 1)


@pytest.mark.parametrize("opts", [Opts(gpu=True), Opts(gpu=True, local={1: 8}), Opts(gpu=True, local={0: 4, 1: 8}, upcast={1: 2})],
                         ids=["a-thread-each", "local", "local-upcast"])
def test_elementwise_and_plain_gemm_threads(opts):
  a, b = rand(0, 16, 24), rand(1, 24, 32)
  np.testing.assert_allclose(run_shaped(matmul(16, 32, 24), [a, b], PY, opts), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [4, 16, 64])
def test_a_reduction_shared_by_the_threads_of_a_block(group):
  x = rand(2, 6, 128)
  root = buf(0, 6 * 128).reshape((6, 128)).reduce(Ops.ADD, 1)
  np.testing.assert_allclose(run_shaped(root, [x], PY, Opts(gpu=True, group=group)), x.sum(1), rtol=1e-5, atol=1e-5)
  mx = buf(0, 6 * 128).reshape((6, 128)).reduce(Ops.MAX, 1)
  np.testing.assert_array_equal(run_shaped(mx, [x], PY, Opts(gpu=True, group=group)), x.max(1))


def test_a_reduction_inside_a_shared_one_runs_per_thread():
  # sum_j (x @ x)[i, j]: the outer sum is shared by the block, each thread's inner sums are its own loops
  x = rand(3, 32, 32)
  xb = buf(0, 32 * 32).reshape((32, 32))
  inner = (xb.reshape((32, 1, 32)).expand((32, 32, 32)) * xb.permute((1, 0)).reshape((1, 32, 32)).expand((32, 32, 32))).reduce(Ops.ADD, 1)
  np.testing.assert_allclose(run_shaped(inner.reduce(Ops.ADD, 1), [x], PY, Opts(gpu=True, group=8)), (x @ x).sum(1), rtol=1e-4, atol=1e-4)


def loss_like(rows: int, classes: int) -> UOp:
  """sum over rows of each row's log-sum-exp (a loss's shape): a reduction over `classes` inside one over `rows`."""
  x = buf(0, rows * classes).reshape((rows, classes))
  return x.alu(Ops.EXP2).reduce(Ops.ADD, 1).alu(Ops.LOG2).reduce(Ops.ADD, 1)


def test_a_reduction_nested_in_a_shared_one_need_not_divide_by_the_block():
  # 65 classes no group divides, inside a sum over 64 rows the block's 16 threads share: each thread runs its rows'
  # inner sums whole (before, group needed every reduced axis divisible, and a loss's sum ran in one thread)
  x = rand(30, 64, 65)
  opts = Opts(gpu=True, group=16)
  got = run_shaped(loss_like(64, 65), [x], PY, opts)
  np.testing.assert_allclose(got, np.log2(np.exp2(x).sum(1)).sum(), rtol=1e-5)
  with pytest.raises(LowerError, match="16 threads do not divide the reduced axis of size 72"):
    run_shaped(loss_like(72, 65), [rand(31, 72, 65)], PY, opts)
  k = make_kernel(loss_like(1024, 65), buf(1, 1))
  assert choose_opts(k, get_backend(PY).caps).group > 1


def test_many_outputs_of_short_sums_get_a_thread_each_few_outputs_a_block_each():
  wide = make_kernel(matmul(1024, 65, 128), buf(2, 1024 * 65))        # 66,560 outputs: a thread each
  narrow = make_kernel(matmul(16, 65, 128), buf(2, 16 * 65))          # 1,040 outputs: a block's threads share each sum
  from uopc.opt import GROUP_OUTPUTS
  assert 16 * 65 <= GROUP_OUTPUTS < 1024 * 65            # the two sides of the threshold this test is about
  caps = get_backend(PY).caps
  assert choose_opts(wide, caps).group == 1 and choose_opts(wide, caps).local
  assert choose_opts(narrow, caps).group > 1


def test_a_staged_gemm_takes_the_largest_tile_that_gives_the_gpu_enough_blocks():
  from uopc.opt import MIN_BLOCKS
  caps = get_backend(PY).caps
  def blocks(o: Opts, m: int, n: int) -> int:
    local, up = dict(o.local), dict(o.upcast)
    return (m // (local[0] * up.get(0, 1))) * (n // (local[1] * up.get(1, 1)))
  big = choose_opts(make_kernel(matmul(1024, 1024, 256), buf(2, 1024 * 1024)), caps)
  assert big.stage and dict(big.local) == {0: 16, 1: 16} and dict(big.upcast) == {0: 4, 1: 4}     # 256 blocks of 64 x 64
  narrow = choose_opts(make_kernel(matmul(128, 512, 1024), buf(2, 128 * 512)), caps)           # 64 x 64: 16 blocks
  assert narrow.stage and blocks(narrow, 128, 512) >= MIN_BLOCKS
  tiny = choose_opts(make_kernel(matmul(16, 16, 64), buf(2, 256)), caps)                         # no tile gives 64: the most
  assert tiny.stage and blocks(tiny, 16, 16) == 16


def test_a_linear_layer_reshaped_into_heads_is_staged_as_a_gemm():
  # (B*T, out) = x @ w summed, then reshaped to (B, T, H, D) and permuted to (B, H, T, D), plus a bias: the movement
  # ops over the sum go under it (gemm_form), so the staged GEMM lowers it at the output's own index
  B, T, H, D, C = 2, 16, 2, 8, 24
  x, w, bias = rand(32, B * T, C), rand(33, C, H * D), rand(34, B, H, T, D)
  heads = matmul(B * T, H * D, C).reshape((B, T, H, D)).permute((0, 2, 1, 3)) + buf(2, B * H * T * D).reshape((B, H, T, D))
  g = gemm_pattern(heads)
  assert g is not None and g.root is gemm_form(heads) and g.root is not heads and g.root.shape == heads.shape
  assert g.reduce.shape == (B, H, T, D) and (g.i, g.j) == (2, 3)   # the sum at the output's own index
  opts = choose_opts(make_kernel(heads, buf(3, B * H * T * D)), get_backend(PY).caps)
  assert opts.stage, opts
  want = (x @ w).reshape(B, T, H, D).transpose(0, 2, 1, 3) + bias
  for o in (opts, Opts(gpu=True, local={2: 4, 3: 4}, upcast={2: 2, 3: 2}, stage=8)):
    np.testing.assert_allclose(run_shaped(heads, [x, w, bias], PY, o), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opts", [Opts(gpu=True, local={0: 4, 1: 4}, upcast={0: 2, 1: 2}, stage=8),
                                  Opts(gpu=True, local={0: 8, 1: 2}, upcast={1: 4}, stage=4),
                                  Opts(gpu=True, local={0: 2, 1: 4}, stage=16, fma=True)], ids=["square", "skewed", "fma"])
def test_a_gemm_staged_in_shared_memory(opts):
  a, b = rand(4, 32, 48), rand(5, 48, 32)
  np.testing.assert_allclose(run_shaped(matmul(32, 32, 48), [a, b], PY, opts), a @ b, rtol=1e-5, atol=1e-5)


def test_a_staged_gemm_with_a_batch_axis_and_a_fused_epilogue():
  a, b = rand(6, 2 * 16 * 16).reshape(2, 16, 16), rand(7, 16, 16)
  root = matmul(16, 16, 16, batch=2)
  relu = root.alu(Ops.MAX, 0.0)
  assert gemm_pattern(relu) is not None and (gemm_pattern(relu).i, gemm_pattern(relu).j) == (1, 2)
  got = run_shaped(relu, [a, b], PY, Opts(gpu=True, local={1: 4, 2: 4}, upcast={1: 2, 2: 2}, stage=8))
  np.testing.assert_allclose(got, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("warps, tiles", [({}, {}), ({0: 2, 1: 2}, {0: 1, 1: 2}), ({1: 2}, {0: 2, 1: 1})], ids=["1warp", "2x2", "2x1"])
def test_a_gemm_of_f16_on_tensor_cores(warps, tiles):
  # the lowering's fragment table (which lane loads and stores which element) against the emulator's own
  a, b = rand(8, 32, 32, dtype=np.float16), rand(9, 32, 64, dtype=np.float16)
  got = run_shaped(matmul(32, 64, 32, dtypes.f16), [a, b], PY, Opts(gpu=True, tc=True, local=warps, upcast=tiles))
  np.testing.assert_allclose(got, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype, opts", [(dtypes.f32, Opts(gpu=True, local={0: 2, 1: 4}, stage=16, fma=True)),
                                          (dtypes.f32, Opts(gpu=True, local={0: 4, 1: 4}, stage=8)),
                                          (dtypes.f16, Opts(gpu=True, tc=True, local={0: 2, 1: 2}, upcast={0: 1, 1: 2}))],
                         ids=["fma", "mul-add", "tensor-cores"])
def test_a_gemm_program_counts_2mnk_flops_however_it_is_lowered(dtype, opts):
  """Program.flops (the profile's GFLOP/s, benchmarks' roofline) of a 32 x 64 x 48 GEMM: a fused multiply-add is two
  operations and a WMMA its lane's share of the warp's m16n8k16; they used to count one and none (an f16 GEMM on the
  tensor cores did 0 FLOPs)."""
  m, n, k = 32, 64, 48
  prog = compile_kernel(make_kernel(matmul(m, n, k, dtype), buf(2, m * n)), get_backend(PY), opts)
  assert any(u.op is (Ops.WMMA if opts.tc else Ops.MULACC if opts.fma else Ops.MUL) for u in prog.uops)
  assert prog.flops == 2 * m * n * k


def test_the_two_wmma_tables_agree_with_the_ptx_layout():
  """Every element of A, B and C is held by exactly one (lane, element) in both tables, and a WMMA of the fragments of
  known matrices gives their product."""
  from uopc.uop import UOp as U
  for table, n, shape in ((wmma_a, 8, (16, 16)), (wmma_b, 4, (16, 8)), (wmma_c, 4, (16, 8))):
    cells = set()
    for lane in range(32):
      for e in range(n):
        r, c = (simplify(v).arg for v in table(U.const(lane), e))
        cells.add((r, c))
    assert cells == {(r, c) for r in range(shape[0]) for c in range(shape[1])}
  A, B, C = rand(10, 16, 16), rand(11, 16, 8), rand(12, 16, 8)
  def frag(table, M, n):
    return np.array([[M[tuple(simplify(v).arg for v in table(U.const(lane), e))] for e in range(n)] for lane in range(32)], np.float32)
  D = wmma(frag(wmma_a, A, 8), frag(wmma_b, B, 4), frag(wmma_c, C, 4))
  np.testing.assert_allclose(D, frag(wmma_c, A @ B + C, 4), rtol=1e-5, atol=1e-5)


def staged_gemm_sink():
  return lower(matmul(32, 32, 32), buf(2, 32 * 32), Ctx(opts=Opts(gpu=True, local={0: 4, 1: 4}, upcast={0: 2, 1: 2}, stage=8)))


def without_barriers(sink, which):
  barriers = [u for u in sink.toposort() if u.op is Ops.BARRIER]     # sources first: in the order they run
  [out] = UOp.wrap([sink], {barriers[k] for k in which}, lambda b: UOp(Ops.SINK, b.src))
  return out


@pytest.mark.parametrize("which", [(0, 1), (0,), (1,)], ids=["both", "after-the-copies", "before-the-next-copies"])
def test_removing_a_barrier_from_the_tiled_gemm_is_a_race(which):
  a, b = rand(13, 32 * 32), rand(14, 32 * 32)
  ok = np.zeros(32 * 32, np.float32)
  run_lowered(staged_gemm_sink(), {0: a, 1: b, 2: ok}, get_backend(PY))
  np.testing.assert_allclose(ok.reshape(32, 32), a.reshape(32, 32) @ b.reshape(32, 32), rtol=1e-5, atol=1e-5)
  with pytest.raises(RaceError, match=r"acc\d+ \(shared\): thread \d+ of block \d+ (reads|writes) element \d+, which (thread \d+|other threads)"):
    run_lowered(without_barriers(staged_gemm_sink(), which), {0: a, 1: b, 2: np.zeros(32 * 32, np.float32)}, get_backend(PY))


@pytest.mark.parametrize("level", [0, 1, 2])
def test_removing_a_barrier_of_a_shared_reduction_is_a_race(level):
  # level 0: between the partials and the tree; 1, 2: between two levels of the tree
  sink = lower(buf(0, 4 * 64).reshape((4, 64)).reduce(Ops.ADD, 1), buf(1, 4), Ctx(opts=Opts(gpu=True, group=16)))
  assert sum(u.op is Ops.BARRIER for u in sink.toposort()) == 6          # the partials, 4 levels of 16 -> 1, the read
  with pytest.raises(RaceError, match=r"thread (\d+) of block 0 reads element (?!\1)\d+, which thread \d+ wrote since the last BARRIER"):
    run_lowered(without_barriers(sink, (level,)), {0: rand(15, 256), 1: np.zeros(4, np.float32)}, get_backend(PY))


@pytest.mark.parametrize("opts, message", [
  (Opts(gpu=True, group=48), "48 threads do not divide the reduced axis of size 64"),
  (Opts(gpu=True, stage=8, local={0: 4}), "not a GEMM"),
  (Opts(gpu=True, tc=True), "not a GEMM"),
  (Opts(group=4), "is a GPU option: it needs gpu=True"),
  (Opts(gpu=True, local={0: 3}), "not divisible by local 3"),
])
def test_gpu_opts_that_dont_fit_are_refused(opts, message):
  root = buf(0, 4 * 64).reshape((4, 64)).reduce(Ops.ADD, 1)
  with pytest.raises(LowerError, match=message): lower(root, buf(1, 4), Ctx(opts=opts))


def test_gemm_opts_that_dont_fit_are_refused():
  with pytest.raises(LowerError, match="tensor cores take f16 operands"): lower(matmul(32, 32, 32), buf(2, 1024), Ctx(opts=Opts(gpu=True, tc=True)))
  with pytest.raises(LowerError, match="not a multiple of the block's tile of 64"):
    lower(matmul(32, 32, 32), buf(2, 1024), Ctx(opts=Opts(gpu=True, stage=16, local={0: 16, 1: 16}, upcast={0: 4})))
  with pytest.raises(LowerError, match="can't copy tiles"):
    lower(matmul(32, 32, 32), buf(2, 1024), Ctx(opts=Opts(gpu=True, stage=2, local={0: 8, 1: 8})))


def test_too_many_threads_for_the_backend_are_refused():
  from uopc.kernelize import make_kernel
  from uopc.runtime import compile_kernel
  root = buf(0, 64 * 64).reshape((64, 64)) * 2.0
  with pytest.raises(LowerError, match="4096 threads per block, but backend PYTHON runs at most 1024"):
    compile_kernel(make_kernel(root, buf(1, 4096)), get_backend(PY), Opts(gpu=True, local={0: 64, 1: 64}))
  with pytest.raises(LowerError, match="backend C is not a GPU"):
    compile_kernel(make_kernel(root, buf(1, 4096)), get_backend("C"), Opts(gpu=True))


def rendered(sink, name="k"):
  lin = linearize(vectorized(sink, get_backend("CUDA")))       # with the CUDA backend's 16-byte vectors, as it compiles
  check_memory_safety(lin)
  return CUDARenderer().render(LinearProgram(name, tuple(lin), tuple(program_buffers(lin))))


def test_the_cuda_renderer_maps_grid_shared_memory_and_barriers():
  src = rendered(staged_gemm_sink(), "tiled")
  assert 'extern "C" __global__ void __launch_bounds__(16) tiled(' in src
  # the two tiles (8 rows of k of 8 floats each, each row padded by 4) are pieces of the block's one dynamic shared
  # memory, whose size the launch passes
  assert "extern __shared__ __align__(16) unsigned char uopc_shared[];" in src and cuda.dynamic_shared_bytes(src) == 768
  assert "(float*)(uopc_shared + 0);" in src and "(float*)(uopc_shared + 384);" in src and src.count("__syncthreads();") == 2
  assert "blockIdx.x" in src and "threadIdx.x" in src and "#pragma omp" not in src
  tc = rendered(lower(matmul(16, 8, 16, dtypes.f16), buf(2, 128), Ctx(opts=Opts(gpu=True, tc=True))), "wmma")
  assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in tc and "half* __restrict__ data0" in tc and "cuda_fp16.h" in tc


def test_cuda_kernels_have_no_cpu_prefetch():
  # the C renderer prefetches a reduction loop's streams (__builtin_prefetch); its CUDA subclass turns that off: nvcc has
  # no such builtin. One of these kernels would get one with it on
  class Prefetching(CUDARenderer): prefetch_bytes = 4096
  def source(renderer, sink):
    lin = linearize(vectorized(sink, get_backend("CUDA")))
    return renderer.render(LinearProgram("k", tuple(lin), tuple(program_buffers(lin))))
  sinks = gpu_test_sinks()
  assert not any("__builtin_prefetch" in rendered(sink) for sink in sinks)
  assert any("__builtin_prefetch" in source(Prefetching(), sink) for sink in sinks)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the CUDA compile checks need it")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_kernels_compile_with_nvcc(arch, tmp_path):
  sources = [rendered(sink) for sink in gpu_test_sinks()]
  # one nvcc run for them all (testing/nvcc_batch.py); the compiler's own road, one kernel, is the failure test's below
  proc, cubin, names = nvcc_batch.nvcc_all([(src, "k") for src in sources], arch, tmp_path)
  assert proc.returncode == 0, proc.stderr
  assert cubin[:4] == b"\x7fELF" and all(n.encode() in cubin for n in names)
  assert all(f"*(({t}*)(data" in "".join(sources) for t in ("float4", "half8", "int4"))       # 16-byte loads and stores were compiled


def big_tiles():
  """A GEMM staged in tiles of 128x64 (A) and 64x128 (B) of f32: 64 KiB of shared memory, over the 48 KiB of static
  __shared__ arrays."""
  return matmul(128, 128, 64), Opts(gpu=True, stage=64, local={0: 16, 1: 16}, upcast={0: 8, 1: 8})


def test_a_gemm_with_64_kib_of_shared_tiles_runs_on_the_emulator():
  root, opts = big_tiles()
  a, b = rand(20, 128, 64), rand(21, 64, 128)
  np.testing.assert_allclose(run_shaped(root, [a, b], PY, opts), a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the CUDA compile checks need it")
def test_a_kernel_with_66_kib_of_shared_memory_compiles_with_nvcc():
  # static __shared__ arrays stop at 48 KiB: ptxas refused this kernel ("uses too much shared data"); its memory is dynamic
  root, opts = big_tiles()
  src = rendered(lower(root, buf(2, 128 * 128), Ctx(opts=opts)))
  assert cuda.dynamic_shared_bytes(src) == 67584         # two tiles of 64 rows of k of 128 + 4 floats
  assert CUDACompiler().compile(src, "k", "sm_90")[:4] == b"\x7fELF"


def test_a_threads_neighbouring_elements_move_as_16_byte_vectors_on_the_emulator():
  """uopc.vectorize folds a staged GEMM's reads of B's tile (shared memory) and its stores of C's rows (global) into
  float4 moves; the emulator runs them (element by element, each checked for races) and gets the GEMM."""
  a, b = rand(4, 32, 48), rand(5, 48, 32)
  opts = Opts(gpu=True, local={0: 8, 1: 2}, upcast={1: 4}, stage=4)
  prog = compile_kernel(make_kernel(matmul(32, 32, 48), buf(2, 32 * 32)), get_backend(PY), opts)
  wide = [u for u in prog.uops if u.op is Ops.INDEX and u.arg is not None]
  assert {u.dtype for u in wide} == {dtypes.f32.vec(4)} and {u.src[0].addrspace for u in wide} == {AddrSpace.SHARED, AddrSpace.GLOBAL}
  np.testing.assert_allclose(run_shaped(matmul(32, 32, 48), [a, b], PY, opts), a @ b, rtol=1e-5, atol=1e-5)
  sink = lower(matmul(32, 32, 48), buf(2, 32 * 32), Ctx(opts=opts))
  with pytest.raises(RaceError, match=r"acc\d+ \(shared\)"):
    run_lowered(without_barriers(sink, (0,)), {0: a, 1: b, 2: np.zeros(32 * 32, np.float32)}, get_backend(PY))


def gpu_test_sinks() -> list[UOp]:
  """A staged f32 GEMM, a tensor-core f16 GEMM (its fragments from memory, and pipelined through shared memory: cp.async,
  ldmatrix) and a block-shared reduction: every GPU lowering's shape; and kernels whose threads move 16 bytes at once:
  float4 (a staged GEMM's tile of B and its rows of C), half8 and int4."""
  wide = lambda root: lower(root, buf(1, 256, root.dtype), Ctx(opts=Opts(gpu=True, local={0: 8}, upcast={0: 8})))
  pipelined = Opts(gpu=True, tc=True, stage=3, local={0: 2, 1: 2}, upcast={0: 2, 1: 4})
  return [staged_gemm_sink(), lower(matmul(16, 8, 16, dtypes.f16), buf(2, 128), Ctx(opts=Opts(gpu=True, tc=True))),
          lower(matmul(64, 64, 64, dtypes.f16), buf(2, 64 * 64), Ctx(opts=pipelined)),
          lower(buf(0, 256).reshape((4, 64)).reduce(Ops.MAX, 1), buf(1, 4), Ctx(opts=Opts(gpu=True, group=16))),
          lower(matmul(32, 32, 32), buf(2, 32 * 32), Ctx(opts=Opts(gpu=True, local={0: 4, 1: 4}, upcast={0: 2, 1: 4}, stage=8))),
          wide(buf(0, 256, dtypes.f16) * 2.0 + 1.0), wide(buf(0, 256, dtypes.i32) * 3 + 1),
          lower(gather_root(), buf(2, 6 * 8 * 32), Ctx(opts=Opts(gpu=True, local={2: 32})))]


def gather_root() -> UOp:
  """Rows of a (64, 32) BUFFER picked by a (6, 8) i32 BUFFER: a load at a loaded index."""
  return buf(0, 64 * 32).reshape((64, 32)).gather(buf(1, 48, dtypes.i32).reshape((6, 8)))


@pytest.mark.parametrize("opts", [Opts(gpu=True), Opts(gpu=True, local={2: 32}), Opts(gpu=True, local={0: 2, 2: 16}, upcast={2: 2})])
def test_a_gather_runs_on_the_emulated_grid_and_its_loads_are_proven_inside_memory(opts):
  # the row is clamped into x's axis (uopc.rangeify), so the proof passes whatever the indices hold; in range, NumPy's rows
  a, idx = rand(30, 64, 32), np.random.default_rng(31).integers(0, 64, (6, 8)).astype(np.int32)
  np.testing.assert_array_equal(run_shaped(gather_root(), [a, idx], PY, opts), a[idx])
  assert "data0" in rendered(lower(gather_root(), buf(2, 6 * 8 * 32), Ctx(opts=opts)))    # (rendered checks memory safety)


@pytest.mark.skipif(cuda._nvrtc() is None, reason="libnvrtc is not installed (pip install nvidia-cuda-nvrtc, or a CUDA toolkit)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_kernels_compile_with_nvrtc(arch):
  # called directly: where nvcc is on PATH the compiler prefers it
  for sink in gpu_test_sinks():
    src = rendered(sink)
    if "cuda_fp16.h" in src and cuda._cuda_include() is None: continue   # needs headers, checked below
    assert CUDACompiler._nvrtc(src, "k", arch)[:4] == b"\x7fELF"
  assert "cuda_fp16.h" not in rendered(gpu_test_sinks()[0])                  # an f32 kernel needs no header at all


WHEEL_NVRTC = """
import ctypes, sys
from pathlib import Path
folder = sys.argv[1]
real = ctypes.CDLL
def only_the_copy(name, *args, **kwargs):   # the machine's other NVRTCs (a toolkit's, the wheel itself) are out of sight
  if "nvrtc" in str(name) and not str(name).startswith(folder): raise OSError(f"{name}: hidden by the test")
  return real(name, *args, **kwargs)
ctypes.CDLL = only_the_copy
import uopc.backends.cuda as cuda
cuda._pip_cuda_dirs = lambda sub: [Path(folder)] if sub == "lib" else []
cubin = cuda.CUDACompiler._nvrtc('extern "C" __global__ void k(float* a) { a[threadIdx.x] = 1.0f; }', "k", "sm_90")
print(cubin[:4] == b"\\x7fELF", len(cubin) > 64)
"""


def test_nvrtc_from_a_wheel_whose_libnvrtc_has_no_runpath_compiles(tmp_path):
  """A wheel's libnvrtc without a RUNPATH (CUDA 13.0's nvidia-cuda-nvrtc; 13.5's has an RPATH of $ORIGIN) opens
  libnvrtc-builtins by name and doesn't find it beside itself, so every compile failed ("failed to open
  libnvrtc-builtins.so.13.0"). Here the wheel's folder is copied with libnvrtc's $ORIGIN blanked out, in a process that
  sees no other NVRTC."""
  wheel = next((d for d in cuda._pip_cuda_dirs("lib") if list(d.glob("libnvrtc.so*")) and list(d.glob("libnvrtc-builtins.so*"))), None)
  if wheel is None: pytest.skip("libnvrtc is not installed (pip install nvidia-cuda-nvrtc): the wheel's NVRTC can't be copied")
  folder = tmp_path / "lib"
  folder.mkdir()
  try:
    for f in wheel.glob("libnvrtc*.so*"):
      data = f.read_bytes()
      (folder / f.name).write_bytes(data.replace(b"$ORIGIN\0", b"/no/dir\0") if f.name.startswith("libnvrtc.so") else data)
    out = subprocess.run([sys.executable, "-c", WHEEL_NVRTC, str(folder)], capture_output=True, text=True, timeout=300)
  finally:
    shutil.rmtree(folder)    # 150 MB
  assert out.returncode == 0 and out.stdout.split() == ["True", "True"], out.stdout + out.stderr[-3000:]


def test_nvrtc_without_cuda_fp16_h_says_where_to_get_it(monkeypatch):
  if cuda._nvrtc() is None: pytest.skip("libnvrtc is not installed: nothing to call")
  from uopc.backends import CompileError
  monkeypatch.setattr(cuda, "_cuda_include", lambda: None)
  with pytest.raises(CompileError, match="needs cuda_fp16.h .* pip install nvidia-cuda-runtime"):
    CUDACompiler._nvrtc(rendered(gpu_test_sinks()[1]), "k", "sm_90")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the CUDA compile checks need it")
def test_nvcc_compiles_every_kind_of_kernel_without_a_warning(tmp_path):
  # INFINITY and NAN were defined over math.h's (which nvcc includes first): two warnings on every compile that used them
  nan = UOp.const(float("nan")).reshape((1,)).expand((4,))
  inf_nan = lower(buf(0, 256).reshape((4, 64)).reduce(Ops.MAX, 1) + nan, buf(1, 4), Ctx(opts=Opts(gpu=True, group=16)))
  sources = [rendered(sink) for sink in gpu_test_sinks() + [inf_nan]]
  assert "INFINITY" in sources[-1] and "NAN" in sources[-1]
  out, _, _ = nvcc_batch.nvcc_all([(src, "k") for src in sources], "sm_90", tmp_path)   # as the backend runs nvcc, one run
  assert out.returncode == 0 and out.stderr == "" and out.stdout == "", f"{out.stderr}{out.stdout}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the CUDA compile checks need it")
def test_an_nvcc_failure_shows_its_message_and_the_source():
  from uopc.backends import CompileError
  with pytest.raises(CompileError, match=r"nvcc failed(.|\n)*--- source ---(.|\n)*   1 \| this is not CUDA"):
    CUDACompiler().compile("this is not CUDA\n", "k", "sm_90")


def test_without_a_device_the_cuda_backend_renders_and_compiles_but_cant_allocate():
  if device_available(): pytest.skip("a CUDA device is present: the no-device error can't be seen here")
  backend = get_backend("CUDA")
  assert backend.caps.gpu and backend.caps.tensor_cores and backend.arch.startswith("sm_")
  with pytest.raises(NoDeviceError, match="no CUDA device was found"): backend.alloc(16, dtypes.f32)


def test_cubins_are_sealed_cache_entries_found_again_and_rebuilt_when_damaged(tmp_path, monkeypatch):
  # the compiler itself is faked: nvcc and NVRTC are not needed to check what the cache does with a cubin
  from uopc.compile_cache import read_entry
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path))
  builds = []
  monkeypatch.setattr(CUDACompiler, "tool", lambda self: "nvcc")
  monkeypatch.setattr(CUDACompiler, "version", lambda self, tool: "nvcc 0.0")
  monkeypatch.setattr(CUDACompiler, "_nvcc", staticmethod(lambda src, arch: builds.append(src) or b"\x7fELF cubin of " + src.encode()))
  assert CUDACompiler().compile("k1", "k", "sm_90") == b"\x7fELF cubin of k1" and len(builds) == 1
  [entry] = tmp_path.glob("*.cubin")
  assert read_entry(entry) == b"\x7fELF cubin of k1"
  assert CUDACompiler().compile("k1", "k", "sm_90") == b"\x7fELF cubin of k1" and len(builds) == 1     # from the disk
  entry.write_bytes(entry.read_bytes()[:-3])                                                            # torn
  assert CUDACompiler().compile("k1", "k", "sm_90") == b"\x7fELF cubin of k1" and len(builds) == 2     # rebuilt
  assert read_entry(entry) == b"\x7fELF cubin of k1"
