"""The pipelined tensor-core GEMM (Opts(tc=True, stage=S), uopc.gpulower) on the PYTHON emulator: correct against NumPy
for odd and multi-block sizes and both memory orders of each operand; its cp.async copies (ASYNC_COPY, ASYNC_COMMIT,
ASYNC_WAIT) checked for races, its ldmatrix (LDMATRIX) checked against the PTX ISA's figure, and every shared-memory
instruction of it free of bank conflicts (the emulator's counts); its CUDA text."""
import os, re
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st
from uopc.uop import UOp, Ops, buf
from uopc.dtype import dtypes
from uopc.rangeify import Opts, Ctx, lower, LowerError, gemm_pattern
from uopc.linearize import linearize
from uopc import gpulower
from uopc.backends import get_backend, LinearProgram, BackendError
from uopc.backends.python import RaceError, ldmatrix, wavefronts
from uopc.backends.cuda import CUDARenderer
from uopc.backends.c import CRenderer
from uopc.runtime import vectorized, program_buffers
from test_cuda_mma_text import C_FIGURE, figure

PY = get_backend("PYTHON")


def gemm(m: int, n: int, k: int, a_t: bool = False, b_t: bool = False) -> UOp:
  """An f16 GEMM summed in f32 over BUFFERs 0 (m x k, or k x m with a_t) and 1 (k x n, or n x k with b_t)."""
  a = buf(0, m * k, dtypes.f16).reshape((k, m) if a_t else (m, k))
  b = buf(1, k * n, dtypes.f16).reshape((n, k) if b_t else (k, n))
  a = (a.permute((1, 0)) if a_t else a).reshape((m, 1, k)).expand((m, n, k))
  b = (b if b_t else b.permute((1, 0))).reshape((1, n, k)).expand((m, n, k))
  return (a.cast(dtypes.f32) * b.cast(dtypes.f32)).reduce(Ops.ADD, 1)


def pipelined(warps=(2, 2), tiles=(2, 4), stages=3) -> Opts:
  return Opts(gpu=True, tc=True, stage=stages, local={0: warps[0], 1: warps[1]}, upcast={0: tiles[0], 1: tiles[1]})


def program(sink: UOp):
  """The PYTHON backend's program of a lowered SINK (vectorized for it, linearized, proven memory-safe)."""
  lin = linearize(vectorized(sink, PY))
  return PY.compile(LinearProgram("gemm", tuple(lin), tuple(program_buffers(lin))), "gemm"), lin


def run(sink: UOp, inputs: list[np.ndarray], n_out: int, dtype=np.float32):
  prog, _ = program(sink)
  out = np.zeros(n_out, dtype)
  PY.launch(prog, [x.reshape(-1) for x in inputs] + [out])
  return out, prog


def operands(seed: int, m: int, n: int, k: int, a_t: bool, b_t: bool):
  rng = np.random.default_rng(seed)
  a, b = rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, n)).astype(np.float16)
  stored = [np.ascontiguousarray(a.T) if a_t else a, np.ascontiguousarray(b.T) if b_t else b]
  return stored, a.astype(np.float32) @ b.astype(np.float32)


# ---- correct, and without a bank conflict ------------------------------------------------------------------------------

@pytest.mark.parametrize("m, n, k, a_t, b_t, opts", [
  (64, 64, 64, False, False, pipelined()),                                   # one block, 2 k-tiles: the pipeline's tail
  (192, 128, 96, False, True, pipelined()),                                  # 6 blocks (3 x 2), B stored n x k
  (64, 192, 72, True, False, pipelined()),                                   # A stored k x m; k = 72: a last tile of 8
  (128, 64, 40, True, True, pipelined(stages=4)),                            # both transposed, 4 stages, k = 40
  (96, 96, 16, False, False, pipelined((1, 1), (2, 4), 2)),                  # 9 blocks of one warp, 1 tile of k
  (128, 128, 64, False, False, pipelined((4, 2), (2, 8), 3)),                # the 128 x 128 block of 8 warps choose_opts takes
  (64, 80, 32, False, True, pipelined((1, 1), (2, 5))),                      # 5 tiles a warp on j: an ldmatrix.x2 for the last
], ids=["one-block", "multi-block-bt", "at-k72", "at-bt-4-stages", "one-warp-blocks", "128x128-8-warps", "odd-tiles-x2"])
def test_the_pipelined_gemm_is_numpys_and_conflict_free(m, n, k, a_t, b_t, opts):
  stored, want = operands(m * n + k, m, n, k, a_t, b_t)
  got, prog = run(lower(gemm(m, n, k, a_t, b_t), buf(2, m * n), Ctx(opts=opts)), stored, m * n)
  np.testing.assert_allclose(got.reshape(m, n), want, rtol=1e-4, atol=1e-4)
  counts = {u: c for u, c in prog.bank_counts.items() if u.op in (Ops.ASYNC_COPY, Ops.LDMATRIX)}
  assert {c.op for c in counts.values()} == {"ASYNC_COPY", "LDMATRIX"} and all(c.warps for c in counts.values())
  assert all(c.conflicts == 0 for c in counts.values()), [c for c in counts.values() if c.conflicts]


def f32_gemm(m: int, n: int, k: int, a_t: bool, b_t: bool) -> UOp:
  """gemm's f32 twin: an f32 GEMM over BUFFERs 0 and 1 stored in either order."""
  a = buf(0, m * k).reshape((k, m) if a_t else (m, k))
  b = buf(1, k * n).reshape((n, k) if b_t else (k, n))
  a = (a.permute((1, 0)) if a_t else a).reshape((m, 1, k)).expand((m, n, k))
  b = (b if b_t else b.permute((1, 0))).reshape((1, n, k)).expand((m, n, k))
  return (a * b).reduce(Ops.ADD, 1)


@pytest.mark.parametrize("a_t, b_t", [(False, False), (False, True), (True, False), (True, True)], ids=["nn", "nt", "tn", "tt"])
def test_a_staged_f32_gemm_copies_each_operand_the_way_its_memory_runs(a_t, b_t):
  # x[i, k] row-major runs along k, stored k-major (a_t) along i; y[k, j] runs along j, stored n-major (b_t) along k.
  # Neighbouring threads copy neighbouring elements (the copy's first index varies fastest with the thread), the
  # k-major tiles are read as float4 rows, and no shared-memory instruction takes more than 2 passes per ideal one
  m, n, k = 64, 64, 32
  root = f32_gemm(m, n, k, a_t, b_t)
  g = gemm_pattern(root)
  assert (g.x_runs_k, g.y_runs_k) == (not a_t, b_t)
  rng = np.random.default_rng(40)
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  stored = [np.ascontiguousarray(a.T) if a_t else a, np.ascontiguousarray(b.T) if b_t else b]
  opts = Opts(gpu=True, stage=16, local={0: 16, 1: 16}, upcast={0: 4, 1: 4})
  got, prog = run(lower(root, buf(2, m * n), Ctx(opts=opts)), stored, m * n)
  np.testing.assert_allclose(got.reshape(m, n), a @ b, rtol=1e-4, atol=1e-4)
  shared = [c for c in prog.bank_counts.values() if c.warps]
  assert shared and all(c.wavefronts <= 2 * c.ideal for c in shared), shared
  loads = [u for u in prog.bank_counts if u.op is Ops.LOAD]
  assert loads and all(u.dtype.count == 4 for u in loads), [u.dtype for u in loads]    # float4 reads of both tiles


def test_without_the_swizzle_the_fragment_loads_conflict(monkeypatch):
  # the counts see the swizzle's work: rows of 64 bytes kept in order put the 8 rows an ldmatrix phase reads in 2 bank groups
  monkeypatch.setattr(gpulower, "swizzle", lambda row, chunk, chunks: chunk)
  stored, want = operands(1, 64, 64, 64, False, False)
  got, prog = run(lower(gemm(64, 64, 64), buf(2, 64 * 64), Ctx(opts=pipelined())), stored, 64 * 64)
  np.testing.assert_allclose(got.reshape(64, 64), want, rtol=1e-4, atol=1e-4)
  ldm = [c for u, c in prog.bank_counts.items() if u.op is Ops.LDMATRIX]
  assert ldm and any(c.wavefronts >= 4 * c.ideal for c in ldm), ldm        # A's rows: 4-way conflicts


def test_a_fused_epilogue_with_f16_output_on_the_pipelined_gemm():
  # bias and ReLU on the accumulators, rounded to f16: stored in pairs (half2) straight from the registers
  m, n, k = 128, 64, 48
  bias = buf(2, n).reshape((1, n)).expand((m, n))
  root = (gemm(m, n, k) + bias).maximum(0.0).cast(dtypes.f16) if hasattr(UOp, "maximum") else \
      UOp(Ops.MAX, (gemm(m, n, k) + bias, UOp.const(0.0).reshape((1, 1)).expand((m, n)))).cast(dtypes.f16)
  stored, want = operands(7, m, n, k, False, False)
  b = np.random.default_rng(8).standard_normal(n).astype(np.float32)
  sink = lower(root, buf(3, m * n, dtypes.f16), Ctx(opts=pipelined()))
  got, _ = run(sink, stored + [b], m * n, np.float16)
  np.testing.assert_allclose(got.reshape(m, n).astype(np.float32), np.maximum(want + b, 0), rtol=2e-3, atol=2e-3)
  _, lin = program(sink)
  assert any(u.op is Ops.STORE and u.src[0].arg == dtypes.f16.vec(2) for u in lin), "the outputs are not stored in pairs"


# ---- the copies in flight: what the emulator reports ---------------------------------------------------------------

def mutated(sink: UOp, op: Ops, change) -> UOp:
  """`sink` with every node of `op` replaced by change(node)."""
  [out] = UOp.wrap([sink], {u for u in sink.toposort() if u.op is op}, change)
  return out


def pipeline_sink(stages: int = 3) -> UOp: return lower(gemm(64, 64, 128), buf(2, 64 * 64), Ctx(opts=pipelined(stages=stages)))


def launch(sink: UOp) -> np.ndarray:
  stored, want = operands(3, 64, 64, 128, False, False)
  got, _ = run(sink, stored, 64 * 64)
  return got.reshape(64, 64), want


def test_reading_a_tile_before_its_copies_are_waited_for_is_a_race():
  got, want = launch(pipeline_sink())
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  # the loop's wait lets one group too many stay in flight: tile t is read while its copies may still be landing
  lax = mutated(pipeline_sink(), Ops.ASYNC_WAIT, lambda u: UOp(u.op, u.src, u.arg + 1) if u.arg else u)
  with pytest.raises(RaceError, match=r"reads element \d+, which a cp.async copy of thread \d+ is still writing"): launch(lax)
  # no wait at all in the loop
  none = mutated(pipeline_sink(), Ops.ASYNC_WAIT, lambda u: UOp(Ops.SINK, u.src) if u.arg else u)
  with pytest.raises(RaceError, match="its group was not waited for"): launch(none)


def test_the_barrier_after_the_wait_is_needed():
  # a thread's copies are visible to the others only after the barrier: without it, a warp reads rows another thread copied
  without = mutated(pipeline_sink(), Ops.BARRIER, lambda u: UOp(Ops.SINK, u.src))
  with pytest.raises(RaceError, match=r"which thread \d+ wrote since the last BARRIER|is still writing"): launch(without)


def test_a_kernel_that_leaves_copies_in_flight_is_refused():
  last = mutated(pipeline_sink(), Ops.ASYNC_WAIT, lambda u: UOp(Ops.SINK, u.src) if u.arg == 0 else u)
  with pytest.raises(BackendError, match="never waited for"): launch(last)


def test_each_group_holds_one_tile():
  # the prologue commits tile 0, then tile 1: a wait for "all but 1" leaves exactly the newest tile in flight
  _, lin = program(pipeline_sink())
  kinds = [u.op for u in lin if u.op in (Ops.ASYNC_COPY, Ops.ASYNC_COMMIT)]
  before_loop = kinds[:kinds.index(Ops.ASYNC_COMMIT, kinds.index(Ops.ASYNC_COMMIT) + 1) + 1]
  assert before_loop == ([Ops.ASYNC_COPY] * 4 + [Ops.ASYNC_COMMIT]) * 2, before_loop


# ---- ldmatrix and the bank counts, against the hardware's own descriptions ----------------------------------------------

# PTX ISA, "Warp-level matrix load instruction: ldmatrix": each thread receives two neighbouring halves of one row of an
# 8x8 matrix, drawn as the ISA draws the first 8 rows of mma.m16n8k16's accumulator (test_cuda_mma_text's C_FIGURE: the
# same cells, lane.element), so the figure is read from there: (lane, element) -> (row, column)
LDMATRIX_AT = figure("\n".join(C_FIGURE.strip().splitlines()[:8]), 8, 8, 2)


@pytest.mark.parametrize("matrices", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_hands_each_lane_the_cells_of_the_ptx_isa_figure(matrices, trans):
  # matrix q's row r is what lane 8q + r points at: fill each with values that name (matrix, row, column)
  rows = np.full((32, 8), -1.0, np.float32)
  for q in range(matrices):
    for r in range(8): rows[8 * q + r] = [q * 100 + r * 10 + c for c in range(8)]
  got = ldmatrix(rows, matrices, trans)
  assert got.shape == (32, 2 * matrices)
  for q in range(matrices):
    for (lane, element), (r, c) in LDMATRIX_AT.items():
      # the figure is of the matrix a lane receives: the rows as stored, or (.trans) their transpose
      stored_r, stored_c = (c, r) if trans else (r, c)
      assert got[lane, 2 * q + element] == q * 100 + stored_r * 10 + stored_c, (q, r, c, lane, element)


def test_wavefronts_count_the_passes_through_the_32_banks():
  lane = np.arange(32)
  assert wavefronts(lane * 4, 4) == (1, 1)                    # a word each, 32 banks
  assert wavefronts(np.zeros(32, np.int64), 4) == (1, 1)      # one word for all: a broadcast
  assert wavefronts(lane * 128, 4) == (32, 1)                 # every lane in bank 0: 32 passes
  assert wavefronts(lane * 8, 4) == (2, 1)                    # two lanes a bank
  assert wavefronts(lane * 2, 2) == (1, 1)                    # halves: two lanes share a word
  assert wavefronts(lane * 16, 16) == (4, 4)                  # 16 bytes a lane: a quarter-warp a pass
  assert wavefronts(lane * 64, 16) == (16, 4)                 # rows of 64 bytes: a quarter's 8 lanes in 2 of 8 bank groups
  assert wavefronts(np.concatenate([lane, lane + 32]) * 4, 4) == (2, 2)   # two warps, a pass each


# ---- choosing it, refusing it --------------------------------------------------------------------------------------

def test_operands_are_copied_along_their_contiguous_axis_or_not_at_all():
  g = gemm_pattern(gemm(64, 64, 64))
  assert (g.x_along_k, g.y_along_k) == (True, False)
  g = gemm_pattern(gemm(64, 64, 64, a_t=True, b_t=True))
  assert (g.x_along_k, g.y_along_k) == (False, True)
  # a fused producer of an operand (x * 2 in f16): nothing in memory to copy, so no pipeline
  a = (buf(0, 64 * 64, dtypes.f16) * 2.0).reshape((64, 1, 64)).expand((64, 64, 64))
  b = buf(1, 64 * 64, dtypes.f16).reshape((64, 64)).permute((1, 0)).reshape((1, 64, 64)).expand((64, 64, 64))
  fused = (a.cast(dtypes.f32) * b.cast(dtypes.f32)).reduce(Ops.ADD, 1)
  assert gemm_pattern(fused).x_along_k is None
  with pytest.raises(LowerError, match="operand x of the GEMM is not read straight from memory"):
    lower(fused, buf(2, 64 * 64), Ctx(opts=pipelined()))


@pytest.mark.parametrize("opts, message", [
  (pipelined(stages=1), "2 or more"),
  (pipelined((1, 4), (1, 2)), "can't copy x's tile of 16x32 in equal shares"),
  (pipelined((1, 1), (2, 2)), "block's extent on it \\(16\\) must be 32 or a multiple of 64"),
])
def test_pipelines_that_dont_fit_are_refused(opts, message):
  with pytest.raises(LowerError, match=message): lower(gemm(64, 64, 64), buf(2, 64 * 64), Ctx(opts=opts))


def test_the_heuristics_choose_the_pipeline_for_an_f16_gemm():
  from uopc.kernelize import kernelize
  from uopc.opt import choose_opts
  [k] = kernelize([(gemm(1024, 1024, 1024), buf(2, 1024 * 1024))])
  o = choose_opts(k, PY.caps)
  assert o.tc and o.stage == 4 and dict(o.local) == {0: 2, 1: 2} and dict(o.upcast) == {0: 4, 1: 8}      # 4 warps of 64x64, 4 stages
  [k] = kernelize([(gemm(96, 96, 64), buf(2, 96 * 96))])           # 96 divides no block of 64 or more: a block of one warp
  o = choose_opts(k, PY.caps)
  assert o.tc and o.stage and dict(o.local) == {} and dict(o.upcast) == {0: 2, 1: 4}


# ---- the CUDA text -------------------------------------------------------------------------------------------------------

def test_the_cuda_text_of_the_pipeline():
  _, lin = program(pipeline_sink())
  src = CUDARenderer().render(LinearProgram("gemm", tuple(lin), tuple(program_buffers(lin))))
  body = src[src.index("{\n"):]
  assert body.count("cp.async.cg.shared.global [%0], [%1], 16, %2;") == 12       # 4 copies a tile: 2 tiles first, 1 a step
  assert body.count("cp.async.commit_group;") == 3 and "cp.async.wait_group 1;" in body and "cp.async.wait_group 0;" in body
  # A (stored m x k: rows along k) read as it is kept, B (stored k x n) transposed; 2 of A and 2 of B each 16 of k
  assert body.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16") == 4
  assert body.count("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") == 4
  # the fragments go to mma.sync as the registers ldmatrix filled, no repacking
  assert "__halves2half2" not in body and len(re.findall(r"const unsigned _r\[6\] = \{(ldm\d+\[\d\], ){5}ldm\d+\[\d\]\}", body)) == 16
  copy = next(u for u in lin if u.op is Ops.ASYNC_COPY)
  with pytest.raises(BackendError, match="CRenderer has no ASYNC_COPY"): CRenderer().render_async(None, copy)


def test_the_swizzle_is_an_xor_of_the_chunk_with_the_row():
  from uopc.symbolic import simplify
  for x in range(40):
    for y in range(8): assert simplify(gpulower.xor(UOp.const(x), UOp.const(y), 3)) is UOp.const(x ^ y), (x, y)
  for row in range(16):
    assert [simplify(gpulower.swizzle(UOp.const(row), UOp.const(c), 4)).arg for c in range(4)] == [c ^ ((row >> 1) & 3) for c in range(4)]
    assert [simplify(gpulower.swizzle(UOp.const(row), UOp.const(c), 16)).arg for c in range(16)] == [c ^ (row & 7) for c in range(16)]


# ---- any pipeline the checks admit ------------------------------------------------------------------------------------

FUZZ = int(os.environ.get("UOPC_FUZZ_ITERS", "60")) // 4     # the Opts fuzzer's budget: a fixed quarter in CI, more on demand


@settings(max_examples=FUZZ, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(warps=st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2])), tiles=st.tuples(st.sampled_from([1, 2, 4]), st.integers(1, 8)),
       stages=st.integers(2, 4), blocks=st.tuples(st.integers(1, 2), st.integers(1, 2)), k8=st.integers(1, 12),
       a_t=st.booleans(), b_t=st.booleans())
def test_any_pipeline_that_is_admitted_is_numpys_and_conflict_free(warps, tiles, stages, blocks, k8, a_t, b_t):
  m, n, k = blocks[0] * warps[0] * tiles[0] * 16, blocks[1] * warps[1] * tiles[1] * 8, k8 * 8
  opts = pipelined(warps, tiles, stages)
  try: sink = lower(gemm(m, n, k, a_t, b_t), buf(2, m * n), Ctx(opts=opts))
  except LowerError as e:
    assert "Opts.stage" in str(e)       # refused by the pipeline's own checks, with the reason
    assume(False)
  stored, want = operands(k8, m, n, k, a_t, b_t)
  got, prog = run(sink, stored, m * n)
  np.testing.assert_allclose(got.reshape(m, n), want, rtol=1e-4, atol=1e-4)
  assert all(c.conflicts == 0 for u, c in prog.bank_counts.items() if u.op in (Ops.ASYNC_COPY, Ops.LDMATRIX)), prog.bank_counts
