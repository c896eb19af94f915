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
             warp on the i and j axes, 32 LOCAL lanes per warp last (the fastest-moving thread index).

Each is a rule rangeify calls (its _reduce, and lower for the tensor cores' output indices) over the state of
uopc.lowering's Ctx: the GpuAxis of every output axis and, for stage and tc, the Gemm that rangeify.gemm_pattern found
(which output axes are its i and j). WMMA's fragment layout (which lane holds which element of A, B and the
accumulator) is written down once, below, from the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point
type"); the PYTHON backend's emulation of WMMA writes it down again, independently, so that each checks the other, and
the CUDA renderer's text (its register packings and mma.sync operands) is run and checked against the ISA's figures
themselves (packages/uopc-backends/tests/test_cuda_mma_text.py).
"""
from __future__ import annotations
from typing import Callable, NoReturn
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
  needs, places = [], []
  for c in range(TM * S // T):
    e = tid + c * T
    needs.append((g.x, at(oi + e // S, oj, kt * S + e % S)))
    places.append(("x", e))
  for c in range(S * TN // T):
    e = tid + c * T
    needs.append((g.y, at(oi, oj + e % TN, kt * S + e // TN)))
    places.append(("y", e))
  values = yield needs
  tile = {"x": ctx.alloc(g.x.dtype, TM * S, AddrSpace.SHARED), "y": ctx.alloc(g.y.dtype, S * TN, AddrSpace.SHARED)}
  staged = UOp(Ops.BARRIER, tuple(tile[w].index(e).store(v) for (w, e), v in zip(places, values)))
  xs, ys = tile["x"].after(staged), tile["y"].after(staged)
  kk = ctx.rng(S, AxisType.REDUCE)
  accs, updates = [], []
  for c_idx in combos:
    acc = ctx.alloc(u.dtype)
    here = acc.after(*ranges_in(*c_idx))
    start = here.index(0).store(UOp.const(0.0))
    a = xs.index(simplify(c_idx[g.i] - oi) * S + kk).load()
    b = ys.index(kk * TN + simplify(c_idx[g.j] - oj)).load()
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
  and y (4 f16) for every tile of its warp, and each tile's accumulator goes through one WMMA."""
  if (done := ctx.gpu.gemm_results.get(idx)) is not None: return done
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


def check_gpu_opts(root: UOp, o: Opts, refuse: Callable[[str, str], NoReturn], g: Gemm | None) -> None:
  """rangeify.check_opts for Opts(gpu=True): `refuse(field, why)` raises. `g` is the kernel's GEMM (rangeify.gemm_pattern)
  when the Opts stage it or put it on tensor cores, else None."""
  shape = root.shape
  up, local = dict(o.upcast), dict(o.local)
  if o.group != 1:
    if o.group < 2: refuse("group", f"must be at least 2 threads, got {o.group}")
    reduces = [u for u in root.toposort() if u.op is Ops.REDUCE and u.arg[1] > 0]
    if not reduces: refuse("group", f"{o.group}, but the kernel has no reduction")
    if wrong := sorted(u.src[0].shape[-1] for u in reduces if u.src[0].shape[-1] % o.group):
      refuse("group", f"{o.group} threads do not divide the reduced axis of size {wrong[0]}")
    if o.local: refuse("group", "the block's threads share the reduction: no local threads on output axes too")
    if o.unroll != 1 or o.stage or o.tc: refuse("group", "takes no unroll, stage or tc")
  if o.stage or o.tc:
    name = "stage" if o.stage else "tc"
    if o.stage and o.tc: refuse("stage", "a GEMM is staged in shared memory (stage) or runs on tensor cores (tc), not both")
    if g is None: refuse(name, "the kernel is not a GEMM (one f32 sum over its last axis of a product whose operands move along "
                               "different output axes, under elementwise ops only)")
    if extra := sorted((set(up) | set(local)) - {g.i, g.j}):
      refuse(name, f"local and upcast apply to the GEMM's axes {g.i} and {g.j} only, not axis {extra[0]}")
    if o.unroll != 1: refuse(name, "takes no unroll")
    ti, tj = local.get(g.i, 1) * up.get(g.i, 1), local.get(g.j, 1) * up.get(g.j, 1)
    if o.tc:
      if not g.f16: refuse("tc", "tensor cores take f16 operands (a sum in f32 of products of f16 values cast to f32)")
      ti, tj = ti * WMMA_M, tj * WMMA_N
      if g.k % WMMA_K: refuse("tc", f"the reduced axis of size {g.k} is not a multiple of {WMMA_K}")
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


def block_threads(o: Opts) -> int:
  """Threads per block of a GPU kernel lowered with Opts o."""
  return prod(dict(o.local).values()) * (32 if o.tc else 1) * (o.group if o.group > 1 else 1)


__all__ = ["wmma_a", "wmma_b", "wmma_c", "WMMA_M", "WMMA_N", "WMMA_K", "combine_group", "staged_gemm", "tc_outputs", "tc_gemm",
           "check_gpu_opts", "block_threads"]
