"""GPU lowering: the kernel shapes rangeify builds with Opts(gpu=True) beyond a thread per output element.

rangeify maps each output axis to GLOBAL (blockIdx) and LOCAL (threadIdx) ranges; every thread computes its own output
elements, reductions included, as a loop of its own. Three Opts change how a reduction is computed:

  group=G    the G threads of a block share each reduction: thread t accumulates elements t, t+G, t+2G, ... of the
             innermost reduced axis (neighbouring threads read neighbouring elements), writes its partial to shared
             memory, and the G partials are combined in a tree, a BARRIER after each level (combine_group).
  stage=S    a GEMM (out[i, j] = sum_k x[i, k] * y[k, j]) keeps tiles of both operands in shared memory: for each
             step of S along k, the block's threads copy a (TM x S) tile of x and an (S x TN) tile of y (TM, TN: the
             block's output tile, local * upcast threads and elements on the i and j axes), BARRIER, then each thread
             multiplies its register tile of upcast_i x upcast_j outputs out of shared memory, BARRIER again before the
             next step overwrites the tiles. The operands are any expressions: staging rangeifies them at the tile's
             indices, so a fused producer (a bias, a ReLU) is computed once per element, by the thread that stages it.
  tc=True    a GEMM of f16 operands summed in f32 runs on tensor cores: each warp computes 16x8 tiles of the output with
             WMMA (mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32), local = warps per block and upcast = tiles per
             warp on the i and j axes, 32 LOCAL lanes per warp last (the fastest-moving thread index). Each lane loads
             its fragments straight from global memory.
  tc, stage=S  the same warps and tiles, their operands through shared memory: a pipeline of S stages of cp.async
             copies, an XOR-swizzled layout, fragments read with ldmatrix (pipelined_tc_gemm, below).

Each is a rule rangeify calls (its _reduce, and lower for the tensor cores' output indices) over the state of
uopc.lowering's Ctx: the GpuAxis of every output axis and, for stage and tc, the Gemm that rangeify.gemm_pattern found
(which output axes are its i and j). WMMA's fragment layout (which lane holds which element of A, B and the
accumulator) is written down once, below, from the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point
type"); the PYTHON backend's emulation of WMMA writes it down again, independently, so that each checks the other, and
the CUDA renderer's text (its register packings and mma.sync operands) is run and checked against the ISA's figures
themselves (packages/uopc-backends/tests/test_cuda_mma_text.py).
"""
from __future__ import annotations
from typing import Callable, NamedTuple, NoReturn
from uopc.uop import UOp, Ops, AxisType, prod
from uopc.dtype import AddrSpace, dtypes
from uopc.symbolic import simplify
from uopc.lowering import Ctx, Opts, Gemm, TensorCoreTile, Fragment, ranges_in

# ---- the WMMA m16n8k16 fragment layout (PTX ISA 9.7.14.5.8) -------------------------------------------------------
# lane l of a warp, group = l // 4, member = l % 4. A (16x16 of f16, row major) element e < 8 of lane l sits at
# row group + 8 for e in {2, 3, 6, 7}, column member*2 + (e & 1) + 8 for e >= 4; B (16x8, column major) element e < 4
# at row member*2 + (e & 1) + 8 for e >= 2, column group; the accumulator C/D (16x8 of f32) element e < 4 at row
# group + 8 for e >= 2, column member*2 + (e & 1).
WMMA_M, WMMA_N, WMMA_K = 16, 8, 16


def wmma_a(lane: UOp, e: int) -> tuple[UOp, UOp]:
  return lane // 4 + (8 if e in (2, 3, 6, 7) else 0), (lane % 4) * 2 + ((e & 1) + (8 if e >= 4 else 0))


def wmma_b(lane: UOp, e: int) -> tuple[UOp, UOp]:
  return (lane % 4) * 2 + ((e & 1) + (8 if e >= 2 else 0)), lane // 4


def wmma_c(lane: UOp, e: int) -> tuple[UOp, UOp]:
  return lane // 4 + (8 if e >= 2 else 0), (lane % 4) * 2 + (e & 1)


# ---- the reductions ----------------------------------------------------------------------------------------------

def _store_sum(here: UOp, start: UOp, loops: list[UOp], a: UOp, b: UOp, fma: bool) -> UOp:
  """The store that adds a*b to the accumulator `here` in the loops (a fused multiply-add with fma)."""
  inside = here.after(start, *loops)
  acc = inside.index(0).load()
  return inside.index(0).store(UOp(Ops.MULACC, (a, b, acc)) if fma else acc + a * b)


def combine_group(u: UOp, partial: UOp, outer: list[UOp], ctx: Ctx) -> UOp:
  """A reduction shared by the block's `group` threads (see the module docstring): `partial` is this thread's share,
  accumulated over elements lane, lane + group, ... of the innermost reduced axis. The partials meet in a tree in
  shared memory: while n > 1 of them are left, thread t < n - m (m = ceil(n / 2)) combines partials t and t + m, so
  n becomes m; each level reads one buffer and writes the other (ping-pong: no thread writes what another may still
  be reading), with a BARRIER after each. Every thread then reads the total, and a last BARRIER lets the buffers be
  written again (by the next iteration of a loop around this reduction)."""
  rop, n, lane = u.arg[0], ctx.opts.group, ctx.gpu.group_lane
  bufs = [ctx.alloc(u.dtype, n, AddrSpace.SHARED), ctx.alloc(u.dtype, n, AddrSpace.SHARED)]
  ready, cur = UOp(Ops.BARRIER, (bufs[0].index(lane).store(partial),)), 0
  while n > 1:
    m = (n + 1) // 2
    src = bufs[cur].after(ready)
    mine, other = src.index(lane).load(), src.index((lane + m) % n).load()   # (lane + m) % n: provably inside the buffer
    cur ^= 1
    ready = UOp(Ops.BARRIER, (bufs[cur].index(lane).store((lane < n - m).where(UOp(rop, (mine, other)), mine)),))
    n = m
  total = ctx.alloc(u.dtype)
  here = total.after(*outer, lane)
  read = here.index(0).store(bufs[cur].after(ready).index(0).load())
  return here.after(read, UOp(Ops.BARRIER, (read,))).index(0).load()


STAGE_PAD = 4    # words after each k-row of a staged GEMM's tiles: 16 bytes, so rows stay aligned for float4 reads


def staged_gemm(u: UOp, idx: tuple[UOp, ...], ctx: Ctx):
  """The generator body of a GEMM whose operand tiles are staged in shared memory (see the module docstring). All of
  the thread's outputs are built at the first request: the barrier after the tile's products waits for every one."""
  if (done := ctx.gpu.gemm_results.get(idx)) is not None: return done
  g, o = ctx.gpu.gemm, ctx.opts
  S = o.stage
  ai, aj = ctx.gpu.axes[g.i], ctx.gpu.axes[g.j]
  oi, oj = ai.origin, aj.origin
  TM, TN, T = ai.threads * ai.per_thread, aj.threads * aj.per_thread, ai.threads * aj.threads   # the block's tiles, its threads
  tid = (ai.thread * aj.threads if ai.thread is not None else UOp.const(0)) + (aj.thread if aj.thread is not None else 0)
  combos = ctx.gpu.outputs
  kt = ctx.rng(g.k // S, AxisType.REDUCE)
  def at(i_val: UOp, j_val: UOp, k_val: UOp) -> tuple[UOp, ...]:
    out = list(combos[0])
    out[g.i], out[g.j] = i_val, j_val
    return tuple(out) + (k_val,)
  # both tiles are k-major, rows of TM (TN) padded by STAGE_PAD: a thread's outputs on i (on j) are neighbours in a row,
  # read as one vector, and a copy along k writes 4 words apart, not in one bank. Each operand is copied the way its
  # memory runs (Gemm.x_runs_k): neighbouring threads take neighbouring k, or neighbouring rows of the output axis
  TMp, TNp = TM + STAGE_PAD, TN + STAGE_PAD
  needs, places = [], []
  for c in range(TM * S // T):
    e = tid + c * T
    row, kq = (e % TM, e // TM) if g.x_runs_k is False else (e // S, e % S)
    needs.append((g.x, at(oi + row, oj, kt * S + kq)))
    places.append(("x", kq * TMp + row))
  for c in range(S * TN // T):
    e = tid + c * T
    col, kq = (e // S, e % S) if g.y_runs_k else (e % TN, e // TN)
    needs.append((g.y, at(oi, oj + col, kt * S + kq)))
    places.append(("y", kq * TNp + col))
  values = yield needs
  tile = {"x": ctx.alloc(g.x.dtype, S * TMp, AddrSpace.SHARED), "y": ctx.alloc(g.y.dtype, S * TNp, AddrSpace.SHARED)}
  staged = UOp(Ops.BARRIER, tuple(tile[w].index(e).store(v) for (w, e), v in zip(places, values)))
  xs, ys = tile["x"].after(staged), tile["y"].after(staged)
  kk = ctx.rng(S, AxisType.REDUCE)
  accs, updates = [], []
  for c_idx in combos:
    acc = ctx.alloc(u.dtype)
    here = acc.after(*ranges_in(*c_idx))
    start = here.index(0).store(UOp.const(0.0))
    a = xs.index(kk * TMp + simplify(c_idx[g.i] - oi)).load()
    b = ys.index(kk * TNp + simplify(c_idx[g.j] - oj)).load()
    accs.append(here)
    updates.append(_store_sum(here, start, [kt, kk], a, b, o.fma))
  # the products of this step are done everywhere before the next step's copies overwrite the tiles
  step_done = UOp(Ops.BARRIER, (UOp(Ops.SINK, tuple(updates)).end(kk),)).end(kt)
  for c_idx, here in zip(combos, accs): ctx.gpu.gemm_results[c_idx] = here.after(step_done).index(0).load()
  return ctx.gpu.gemm_results[idx]


def tc_outputs(ctx: Ctx, shape: tuple[int, ...]) -> list[tuple[UOp, ...]]:
  """The output indices one thread stores with tensor cores: for each of its warp's FM x FN tiles, the 4 accumulator
  elements its lane holds (wmma_c). Creates the GLOBAL ranges (one per axis) and the LOCAL ones (warps on i and j,
  then the 32 lanes)."""
  g, o = ctx.gpu.gemm, ctx.opts
  local, up = dict(o.local), dict(o.upcast)
  WM, WN, FM, FN = local.get(g.i, 1), local.get(g.j, 1), up.get(g.i, 1), up.get(g.j, 1)
  tile = {g.i: WM * FM * WMMA_M, g.j: WN * FN * WMMA_N}
  base: list[UOp] = []
  for k, size in enumerate(shape):
    blocks = size // tile.get(k, 1)
    r = ctx.rng(blocks, AxisType.GLOBAL) if blocks > 1 else UOp.const(0)
    base.append(r * tile[k] if k in tile else r)
  wm = ctx.rng(WM, AxisType.LOCAL) if WM > 1 else UOp.const(0)
  wn = ctx.rng(WN, AxisType.LOCAL) if WN > 1 else UOp.const(0)
  lane = ctx.rng(32, AxisType.LOCAL)
  ctx.gpu.tc = TensorCoreTile(base[g.i], base[g.j], wm, wn, lane, FM, FN)
  combos = []
  for fm in range(FM):
    for fn in range(FN):
      for e in range(4):
        row, col = wmma_c(lane, e)
        out = list(base)
        out[g.i] = simplify(base[g.i] + (wm * FM + fm) * WMMA_M + row)
        out[g.j] = simplify(base[g.j] + (wn * FN + fn) * WMMA_N + col)
        ctx.gpu.tc_fragments[tuple(out)] = Fragment(fm, fn, e)
        combos.append(tuple(out))
  return combos


def tc_gemm(u: UOp, idx: tuple[UOp, ...], ctx: Ctx):
  """The generator body of a GEMM on tensor cores: per step of 16 along k, each lane loads its fragments of x (8 f16)
  and y (4 f16) for every tile of its warp, and each tile's accumulator goes through one WMMA. With Opts.stage, the
  operands come through shared memory instead (pipelined_tc_gemm)."""
  if (done := ctx.gpu.gemm_results.get(idx)) is not None: return done
  if ctx.opts.stage: return (yield from pipelined_tc_gemm(idx, ctx))
  g, tile = ctx.gpu.gemm, ctx.gpu.tc
  oi, oj, wm, wn, lane, FM, FN = tile.row, tile.col, tile.warp_i, tile.warp_j, tile.lane, tile.tiles_i, tile.tiles_j
  kt = ctx.rng(g.k // WMMA_K, AxisType.REDUCE)
  def at(i_val: UOp, j_val: UOp, k_val: UOp) -> tuple[UOp, ...]:
    out = list(idx)
    out[g.i], out[g.j] = i_val, j_val
    return tuple(out) + (k_val,)
  needs = []
  for fm in range(FM):
    for e in range(8):
      row, col = wmma_a(lane, e)
      needs.append((g.x16, at(simplify(oi + (wm * FM + fm) * WMMA_M + row), oj, simplify(kt * WMMA_K + col))))
  for fn in range(FN):
    for e in range(4):
      row, col = wmma_b(lane, e)
      needs.append((g.y16, at(oi, simplify(oj + (wn * FN + fn) * WMMA_N + col), simplify(kt * WMMA_K + row))))
  values = yield needs
  a_frags = [UOp(Ops.STACK, tuple(values[fm * 8:(fm + 1) * 8])) for fm in range(FM)]
  b_frags = [UOp(Ops.STACK, tuple(values[FM * 8 + fn * 4:FM * 8 + (fn + 1) * 4])) for fn in range(FN)]
  outer = ranges_in(*idx)
  tiles, updates = {}, []
  for fm in range(FM):
    for fn in range(FN):
      acc = ctx.alloc(dtypes.f32, 4)
      here = acc.after(*outer)
      starts = [here.index(e).store(UOp.const(0.0)) for e in range(4)]
      inside = here.after(*starts, kt)
      d = UOp(Ops.WMMA, (a_frags[fm], b_frags[fn], UOp(Ops.STACK, tuple(inside.index(e).load() for e in range(4)))))
      updates += [inside.index(e).store(d.index(e)) for e in range(4)]
      tiles[(fm, fn)] = here
  done = UOp(Ops.SINK, tuple(updates)).end(kt)
  for c_idx, (fm, fn, e) in ctx.gpu.tc_fragments.items(): ctx.gpu.gemm_results[c_idx] = tiles[(fm, fn)].after(done).index(e).load()
  return ctx.gpu.gemm_results[idx]


# ---- the pipelined tensor-core GEMM (tc=True, stage=S) -----------------------------------------------------------------
# The block's operand tiles of TK (32) along k pass through shared memory in a ring of S stages: 16-byte cp.async copies
# (ASYNC_COPY) fill stage t % S with k-tile t while the warps compute on an earlier one. Before the loop the copies of
# tiles 0 .. S-2 are issued, a group (ASYNC_COMMIT) each. Step t of the loop waits until at most S-2 groups are in flight
# (tile t has landed: ASYNC_WAIT), one BARRIER (every thread's copies of tile t are visible, and every warp is done with
# tile t-1, whose stage the next copies overwrite), issues tile t+S-1 into stage (t+S-1) % S, commits it, and multiplies
# tile t: per step of 16 along k, each warp's fragments are read with ldmatrix.x4 (LDMATRIX: an A fragment of 16x16 per
# instruction, the B fragments of two 16x8 tiles per instruction), then one WMMA per 16x8 tile, each step's WMMA adding
# to the last one's result. Every fragment of the tile depends only on the barrier, not on an earlier WMMA, so the next
# step's fragments load while this step's products run (registers double-buffered: the SASS has LDSM among the HMMAs).
#
# Each operand is copied along the axis its memory is contiguous on (rangeify.copy_along_k: k for x[i, k] row-major, the
# output axis for a transposed one), so a tile is rows of 16-byte chunks: rows of the output axis and 32 halves (4
# chunks) along k, or rows of k and the block's extent along the output axis. The chunk c of row r sits at chunk
# swizzle(r, c) of its row (an XOR swizzle): with 4 chunks a row (64 bytes: two rows cover the 32 banks), c ^ ((r >> 1)
# & 3), else c ^ (r & 7), so that the 8 rows one ldmatrix phase reads, and the 8 chunks one quarter-warp copies, fall
# in 8 different 16-byte bank groups (the PYTHON backend counts the conflicts). A chunk past the end of k is zeros
# (ASYNC_COPY's valid), so k needs to be a multiple of 8 only; a tile past the last is copied as zeros too (the loop's
# last S-1 steps issue nothing useful). The epilogue (what kernelize fused after the sum) runs on the accumulators in
# registers; each lane's neighbouring pairs of outputs are stored together (uopc.vectorize: float2, or half2 for f16).
TK = 32


class _Operand(NamedTuple):
  """One operand of a pipelined GEMM as its copies and fragment loads see it."""
  expr: UOp                   # its f16 value (Gemm.x16 or y16)
  axis: int                   # the output axis it moves along (Gemm.i or j)
  origin: UOp                 # the block's first index on that axis
  extent: int                 # the block's extent on it
  inner_k: bool               # a tile row is 32 of k (its memory is contiguous on k), else the block's extent on `axis`
  mem: UOp                    # the shared ALLOC of its S stages
  row_len: int                # halves a tile row

  @property
  def chunks(self) -> int: return self.row_len // 8       # 16-byte chunks a row

  def shared_at(self, stage: UOp, row: UOp, chunk: UOp) -> UOp:
    """Where chunk `chunk` of tile row `row` starts in stage `stage` of the ring (swizzled within its row)."""
    return simplify(stage * self.extent * TK + row * self.row_len + swizzle(row, chunk, self.chunks) * 8)


def xor(x: UOp, y: UOp, bits: int) -> UOp:
  """x ^ y for non-negative x and y < 2**bits, with the IR's integer ops (it has no bitwise ones): x's bits above `bits`
  as they are, each bit below set where x's and y's differ. A swizzle is computed once per thread, outside the k loop."""
  out = x // (1 << bits) * (1 << bits)
  for b in range(bits): out = out + (x // (1 << b) % 2).ne(y // (1 << b) % 2).cast(dtypes.i32) * (1 << b)
  return out


def swizzle(row: UOp, chunk: UOp, chunks: int) -> UOp:
  """The chunk of its row where chunk `chunk` of tile row `row` is kept (see above): chunk ^ ((row >> 1) & 3) for rows of
  4 chunks, chunk ^ (row & 7) for rows of 8 or more."""
  return xor(chunk, row // 2 % 4, 2) if chunks == 4 else xor(chunk, row % 8, 3)


def _min(x: UOp, c: int) -> UOp: return -UOp(Ops.MAX, (-x, UOp.const(-c)))


def pipelined_tc_gemm(idx: tuple[UOp, ...], ctx: Ctx):
  """tc_gemm's body with the operands staged in shared memory by cp.async, read with ldmatrix (see above)."""
  g, tile, o = ctx.gpu.gemm, ctx.gpu.tc, ctx.opts
  S, K = o.stage, g.k
  oi, oj, wm, wn, lane, FM, FN = tile.row, tile.col, tile.warp_i, tile.warp_j, tile.lane, tile.tiles_i, tile.tiles_j
  local = dict(o.local)
  WM, WN = local.get(g.i, 1), local.get(g.j, 1)
  T = WM * WN * 32
  tid = (wm * WN + wn) * 32 + lane       # the thread's number in its block (the LOCAL ranges' digits)
  kt = ctx.rng(-(-K // TK), AxisType.REDUCE)
  ops = []
  for expr, axis, origin, extent, along_k in ((g.x16, g.i, oi, WM * FM * WMMA_M, g.x_along_k), (g.y16, g.j, oj, WN * FN * WMMA_N, g.y_along_k)):
    ops.append(_Operand(expr, axis, origin, extent, along_k, ctx.alloc(dtypes.f16, S * extent * TK, AddrSpace.SHARED), TK if along_k else extent))

  def at(op: _Operand, a_val: UOp, k_val: UOp) -> tuple[UOp, ...]:
    out = list(idx)
    out[g.j if op.axis == g.i else g.i] = oj if op.axis == g.i else oi   # the other output axis: the operand doesn't move on it
    out[op.axis] = a_val
    return tuple(out) + (k_val,)

  def chunk_needs(t: UOp, want: list) -> list:
    """The operand values at the first element of each 16-byte chunk this thread copies of k-tile t (the rest of a chunk
    are its neighbours in memory: rangeify.copy_along_k proved it), and (operand, tile, row, chunk, valid) into `want`."""
    needs = []
    for op in ops:
      for m in range(op.extent * TK // 8 // T):
        q = tid + m * T
        row, c = q // op.chunks, q % op.chunks
        a_off, k_off = (row, c * 8) if op.inner_k else (c * 8, row)
        k = t * TK + k_off
        # past the end of k the copy is zeros and reads nothing; its address stays inside the operand anyway
        k_src = _min(k, K - 8) if op.inner_k else _min(k, K - 1)
        needs.append((op.expr, at(op, simplify(op.origin + a_off), simplify(k_src))))
        want.append((op, t, row, c, k < K))
    return needs

  prologue: list[list] = [[] for _ in range(S - 1)]
  needs = [n for s in range(S - 1) for n in chunk_needs(UOp.const(s), prologue[s])]
  ahead: list = []
  needs += chunk_needs(kt + (S - 1), ahead)
  values = yield needs

  def copies(want: list, vals: list, after: UOp | None) -> list[UOp]:
    out = []
    for (op, t, row, c, valid), v in zip(want, vals):
      dst = op.mem.after(after) if after is not None else op.mem
      out.append(UOp(Ops.ASYNC_COPY, (UOp(Ops.INDEX, (dst, op.shared_at(t % S, row, c)), dtypes.f16.vec(8)),
                                      UOp(Ops.INDEX, v.src[0].src, dtypes.f16.vec(8)), simplify(valid))))
    return out

  n = len(ahead)
  commit = None
  for s in range(S - 1):   # each tile's copies after the commit of the one before: a group holds one tile
    commit = UOp(Ops.ASYNC_COMMIT, tuple(copies(prologue[s], values[s * n:(s + 1) * n], commit)))
  landed = UOp(Ops.ASYNC_WAIT, (commit, kt), S - 2)
  ready = UOp(Ops.BARRIER, (landed,))
  issued = UOp(Ops.ASYNC_COMMIT, tuple(copies(ahead, values[(S - 1) * n:], ready)))

  def ldmatrix(w: int, a0: UOp, k0: int, n: int) -> UOp:
    """LDMATRIX of n 8x8 matrices of operand w from the current stage: matrix m covers output-axis rows a0 + 8 * ah .. + 7
    and k k0 + 8 * kh .. + 7, with m = ah + 2 * kh for x (an A fragment's order) and m = kh + 2 * ah for y (two B
    fragments, one after the other); lane l gives row l % 8 of matrix (l // 8) % n. The copy's row is the output axis
    (along k) or k: the matrix is read as it is kept, or transposed (trans), so the lane gets what WMMA takes."""
    op = ops[w]
    m, r = (lane // 8) % n, lane % 8
    ah, kh = (m % 2, m // 2) if w == 0 else (m // 2, m % 2)
    if op.inner_k: row, c = a0 + ah * 8 + r, kh + k0 // 8
    else: row, c = kh * 8 + k0 + r, (a0 + ah * 8) // 8
    # after the next tile's copies are issued: they run while the warps multiply this one
    return UOp(Ops.LDMATRIX, (UOp(Ops.INDEX, (op.mem.after(ready, issued), op.shared_at(kt % S, row, c)), dtypes.f16.vec(8)),),
               (n, not op.inner_k))

  outer = ranges_in(*idx)
  accs, sums = {}, {}
  for fm in range(FM):
    for fn in range(FN):
      here = ctx.alloc(dtypes.f32, 4).after(*outer)
      inside = here.after(*[here.index(e).store(UOp.const(0.0)) for e in range(4)], kt)
      accs[(fm, fn)] = (here, inside)
      sums[(fm, fn)] = UOp(Ops.STACK, tuple(inside.index(e).load() for e in range(4)))
  for k0 in range(0, TK, WMMA_K):
    a = [ldmatrix(0, (wm * FM + fm) * WMMA_M, k0, 4) for fm in range(FM)]
    b = []
    for fn in range(0, FN - 1, 2):
      ld = ldmatrix(1, (wn * FN + fn) * WMMA_N, k0, 4)
      b += [UOp(Ops.STACK, tuple(ld.index(e) for e in range(4))), UOp(Ops.STACK, tuple(ld.index(e) for e in range(4, 8)))]
    if FN % 2: b.append(ldmatrix(1, (wn * FN + FN - 1) * WMMA_N, k0, 2))
    for fm in range(FM):
      for fn in range(FN):
        d = UOp(Ops.WMMA, (a[fm], b[fn], sums[(fm, fn)]))
        sums[(fm, fn)] = UOp(Ops.STACK, tuple(d.index(e) for e in range(4)))
  updates = [accs[t][1].index(e).store(sums[t].src[e]) for t in accs for e in range(4)]
  # the last groups (tiles past the end, all zeros) are waited for too: no copy is in flight when the kernel moves on
  done = UOp(Ops.ASYNC_WAIT, (UOp(Ops.SINK, tuple(updates) + (issued,)).end(kt),), 0)
  for c_idx, (fm, fn, e) in ctx.gpu.tc_fragments.items(): ctx.gpu.gemm_results[c_idx] = accs[(fm, fn)][0].after(done).index(e).load()
  return ctx.gpu.gemm_results[idx]


def outer_reductions(root: UOp) -> list[UOp]:
  """The reductions of root that are not inside another reduction's operand: the ones group splits among a block's
  threads. One nested in another (a loss's sum over rows of each row's log-sum-exp) runs whole in each thread, at the
  outer one's elements of that thread (rangeify._reduce)."""
  seen, stack, out = {root}, [root], []
  while stack:
    u = stack.pop()
    if u.op is Ops.REDUCE and u.arg[1] > 0:
      out.append(u)
      continue
    for s in u.src:
      if s not in seen:
        seen.add(s)
        stack.append(s)
  return out


def check_gpu_opts(root: UOp, o: Opts, refuse: Callable[[str, str], NoReturn], g: Gemm | None) -> None:
  """rangeify.check_opts for Opts(gpu=True): `refuse(field, why)` raises. `g` is the kernel's GEMM (rangeify.gemm_pattern)
  when the Opts stage it or put it on tensor cores, else None."""
  shape = root.shape
  up, local = dict(o.upcast), dict(o.local)
  if o.group != 1:
    if o.group < 2: refuse("group", f"must be at least 2 threads, got {o.group}")
    reduces = outer_reductions(root)
    if not reduces: refuse("group", f"{o.group}, but the kernel has no reduction")
    if wrong := sorted(u.src[0].shape[-1] for u in reduces if u.src[0].shape[-1] % o.group):
      refuse("group", f"{o.group} threads do not divide the reduced axis of size {wrong[0]}")
    if o.local: refuse("group", "the block's threads share the reduction: no local threads on output axes too")
    if o.unroll != 1 or o.stage or o.tc: refuse("group", "takes no unroll, stage or tc")
  if o.stage or o.tc:
    name = "stage" if o.stage else "tc"
    if g is None: refuse(name, "the kernel is not a GEMM (one f32 sum over its last axis of a product whose operands move along "
                               "different output axes, under elementwise ops only)")
    if extra := sorted((set(up) | set(local)) - {g.i, g.j}):
      refuse(name, f"local and upcast apply to the GEMM's axes {g.i} and {g.j} only, not axis {extra[0]}")
    if o.unroll != 1: refuse(name, "takes no unroll")
    ti, tj = local.get(g.i, 1) * up.get(g.i, 1), local.get(g.j, 1) * up.get(g.j, 1)
    if o.tc:
      if not g.f16: refuse("tc", "tensor cores take f16 operands (a sum in f32 of products of f16 values cast to f32)")
      ti, tj = ti * WMMA_M, tj * WMMA_N
      if o.stage: _check_pipeline(o, g, local, up, ti, tj, refuse)
      elif g.k % WMMA_K: refuse("tc", f"the reduced axis of size {g.k} is not a multiple of {WMMA_K}")
    else:
      threads = local.get(g.i, 1) * local.get(g.j, 1)
      if g.k % o.stage: refuse("stage", f"{o.stage} does not divide the reduced axis of size {g.k}")
      if (ti * o.stage) % threads or (tj * o.stage) % threads:
        refuse("stage", f"the {threads} threads of a block can't copy tiles of {ti}x{o.stage} and {o.stage}x{tj} in equal shares")
    for axis, t in ((g.i, ti), (g.j, tj)):
      if shape[axis] % t: refuse(name, f"axis {axis} of size {shape[axis]} is not a multiple of the block's tile of {t}")
    return
  for k, n in o.local:
    if shape[k] % (n * up.get(k, 1)): refuse("local", f"axis {k} of size {shape[k]} is not divisible by local {n} * upcast {up.get(k, 1)}")


def _check_pipeline(o: Opts, g: Gemm, local: dict, up: dict, ti: int, tj: int, refuse: Callable[[str, str], NoReturn]) -> None:
  """check_gpu_opts for a pipelined tensor-core GEMM (tc=True, stage=S): a block tile of ti x tj outputs."""
  if o.stage < 2: refuse("stage", f"a pipeline of shared-memory stages has 2 or more, got {o.stage}")
  threads = local.get(g.i, 1) * local.get(g.j, 1) * 32
  for name, along, extent in (("x", g.x_along_k, ti), ("y", g.y_along_k, tj)):
    if along is None:
      refuse("stage", f"operand {name} of the GEMM is not read straight from memory in aligned runs of 8 halves (along k or along "
                      "its output axis), which 16-byte cp.async copies need: use tc without stage")
    if (extent * TK // 8) % threads:
      refuse("stage", f"the {threads} threads of a block can't copy {name}'s tile of {extent}x{TK} in equal shares of 16 bytes")
    if not along and extent != 32 and extent % 64:
      refuse("stage", f"operand {name} is copied along its output axis: the block's extent on it ({extent}) must be 32 or a multiple of 64")


def block_threads(o: Opts) -> int:
  """Threads per block of a GPU kernel lowered with Opts o."""
  return prod(dict(o.local).values()) * (32 if o.tc else 1) * (o.group if o.group > 1 else 1)


__all__ = ["wmma_a", "wmma_b", "wmma_c", "WMMA_M", "WMMA_N", "WMMA_K", "combine_group", "staged_gemm", "tc_outputs", "tc_gemm",
           "check_gpu_opts", "block_threads", "outer_reductions", "STAGE_PAD"]
