"""uopc.opt: choosing the Opts a kernel is lowered with, from what the kernel reads and what the backend can do.

    choose_opts(kernel, caps) -> Opts          the heuristics (uopc.runtime asks whenever no Opts are given)
    analyze(kernel) -> Analysis                what they read: each load's stride along each loop
    candidates(kernel, caps, base)             valid Opts around a choice, for the timed search (uopc.search)
    graph_rewrite(caps)                        what the machine wants done to a graph before kernelize (a CPU packs
                                               GEMM operands into panels), for kernelize's `rewrite`

`Caps` is what a backend tells the optimizer (and uopc.vectorize) about its machine: how many threads run a parallel
loop, how many f32 lanes a vector holds and how many vector registers there are, how wide a memory move can be, the
cache sizes, whether it has fused multiply-add, whether it is a GPU, whether its GEMMs want a badly read operand
packed into panels first.

The heuristics read the kernel the way a person would: lower it plainly once, and evaluate every load's index at
counter 0 and 1 of each loop to get its stride. Then, for a CPU:

  * vectors: an output axis along which the output and some load are contiguous (stride 1) becomes SIMD lanes
    (Opts.vector), with a few copies of the vector per iteration for independent work (4 in a sum down rows of 32 vectors
    or more). A GEMM's columns are such an axis, and so are a column sum's and an elementwise kernel's last axis.
    Otherwise, when the loads are contiguous along the innermost reduced axis (row sums, softmax, a dot product),
    that axis gets lanes of partial accumulators (Opts.reduce_vector), unrolled for more of them.
  * register tiles: a GEMM (a sum of products in which one operand is constant along the vector axis, the other along
    the axis before it; or of values masked by a condition, a one-hot scatter such as an embedding's gradient, whose
    rows' positions are read outside the sum) computes rows x vectors of outputs per iteration, which keeps that many
    vector accumulators and the FMA units busy while each loaded value is used once per row or vector (Opts.upcast):
    the most accumulators whose registers, with the loaded vectors and the broadcast, fit in the machine's
    (Caps.vector_registers): 8 rows x 3 or 2 vectors with AVX-512's 32, 4 x 3 or 6 x 2 or 4 x 2 with AVX2's 16
    (_register_tile); with 256 rows or more, they are walked 64 at a time (a cache tile, Opts.tile), unless the
    threads' parts of B outgrow the L2 and the sum, over an A read row by row, is deeper than ROW_TILE_MAX_DEPTH; a GEMM of
    GEMM_UNROLL_WORK multiply-adds or more whose accumulators take at most half the registers takes GEMM_UNROLL steps
    of k a trip (Opts.unroll). A convolution tiles 8 output channels x 2 rows of one vector (32 registers) or 4
    channels x 2 vectors (16), not a GEMM's heads (more columns); a sum vectorized along an earlier output axis tiles
    a later one its vector loads are constant along (a convolution's input gradient, its 9 window positions); output
    axes along which no load moves, in a kernel with a STACK, are unrolled whole, so each copy loads its own branch (a
    convolution's weight gradient, its window positions).
  * fused multiply-adds on the backend that has them (Opts.fma).
  * a concatenation's kernel splits its last loop where the branch changes (Opts.split).
  * threads: the outermost axis with enough iterations for every thread, when the kernel does enough work to pay for
    waking them, THREAD_MIN_WORK (half as much for a copy that reads a line an element, lane by lane: attention's k packed into
    panels; OMP_NUM_THREADS is the backend's business: it sets caps.threads); a GEMM's column tiles, or its rows
    when its B fits in half an L2 (_rows_first).
  * a copy that transposes (a GEMM operand packed into panels, x.T) walks its rows in blocks of 32 (16 where 32 doesn't
    divide them) inside each column, the blocks split across the threads (_transposing_axis), so every line it reads
    serves a block's rows before leaving the L1. On a machine with gathers (Caps.gather: AVX-512) it takes vectors
    instead, each lane gathered, with the axis it reads contiguously walked innermost in blocks of 16 (Opts.inner,
    _gather_copy); so does the gathered part of a vectorized concatenation (_gathered_axis: v's gradient read
    transposed into qkv's).

Every choice is checked by check_opts like any user's Opts, so the heuristics can only pick valid ones.

One CPU choice changes the schedule rather than a kernel, so it is made on the graph before kernelize: a GEMM whose B
operand the vector loads would read badly (along its columns, or rows 2 KiB apart or more) gets B packed into panels of
caps.gemm_panel columns, a kernel of its own (uopc.packing.GemmPacking, kernelize's `rewrite`), and a deep, narrow GEMM (K
16 times N or more, a B over half the L2) is summed in chunks of K whose B fits in half of caps.l2_bytes. Only a backend
whose Caps ask for it packs: a GPU stages its own tiles, and its tensor cores need the f16 operand the packed f32 copy
would replace.
"""
from __future__ import annotations
import dataclasses, functools, math
from dataclasses import dataclass
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, AxisType, MOVEMENT, prod
from uopc.lowering import Opts, Ctx, LowerError
from uopc.rangeify import lower, check_opts, gemm_pattern
from uopc.gpulower import block_threads, outer_reductions
from uopc.kernelize import Kernel
from uopc.symbolic import simplify
from uopc.evaluate import exec_alu, const_value, EvalError
from uopc.packing import (GemmPacking, PACK_STRIDE, PACK_BIG, PACK_MID, PACK_MID_ROWS, PACK_MIN_ROWS, PACK_ROWS,   # (here too, as before)
                          PACK_MIN_DEPTH, PACK_MIN_WORK, divisor_at_most)


@dataclass(frozen=True)
class Caps:
  """What a backend's machine offers the optimizer."""
  threads: int = 1                  # threads a parallel (THREAD) loop is split across
  vector_width: int = 1             # f32 lanes in one SIMD register (1: no vectors: UPCAST lanes stay loops, uopc.vectorize)
  vector_bytes: int = 0             # the widest aligned load or store that neighbouring scalar ones fold into (a GPU's 16)
  vector_registers: int = 0         # SIMD registers: a register tile's accumulators and operands must fit in them, or gcc
                                    # keeps some on the stack. 0: what the width says on x86-64 (32 with 16 lanes: AVX-512;
                                    # else 16: AVX2 and SSE); AArch64 has 32 of 4 lanes, which its backend says
  fma: bool = False                 # fused multiply-add units
  l1_bytes: int = 32 * 1024         # per-core data cache
  l2_bytes: int = 1024 * 1024
  gpu: bool = False                 # lowers to GLOBAL/LOCAL ranges, shared memory and barriers
  max_local: int = 1                # threads per block (GPU)
  tensor_cores: bool = False        # WMMA m16n8k16 on f16 (GPU, sm_80 and later)
  gemm_panel: int = 0               # columns of the panels a badly read GEMM operand is packed into first (GemmPacking); 0: none
  gather: bool = False              # a vector of elements far apart loads in one instruction (AVX-512's gathers): a transposing
                                    # copy is vectorized (_gather_copy)

  def __post_init__(self):
    if self.vector_registers == 0: object.__setattr__(self, "vector_registers", 32 if self.vector_width >= 16 else 16)
    for name in ("threads", "vector_width", "vector_registers", "l1_bytes", "l2_bytes", "max_local"):
      v = getattr(self, name)
      if type(v) is not int or v < 1: raise LowerError(f"Caps.{name} must be a positive int, got {v!r}")
    for name in ("vector_bytes", "gemm_panel"):
      v = getattr(self, name)
      if type(v) is not int or v < 0: raise LowerError(f"Caps.{name} must be an int >= 0, got {v!r}")


# a kernel doing less than this many element operations runs on one thread: waking the others costs more. Measured
# inside native graphs on 2 cores: 32K-element kernels threaded run in 55-65% of their time alone (attention's
# backward at N = 512, three 512 x 64 kernels: 23 -> 14 us; the default GPT's 384 x 128 AdamW updates, 6 a step, 186
# -> 102 us); 16K ones gained less than the graph's noise
THREAD_MIN_WORK = 1 << 15
# ... or from this many for a copy that reads a cache line an element (a transposing copy, lane by lane or gathered:
# attention's k packed into panels, 32K elements, 21 -> 14 us threaded, when the threshold above was 64K)
LINE_COPY_MIN_WORK = 1 << 14
DOT_ROWS = 8               # rows of a GEMM read as dot products that share each loaded vector of the other operand
GEMM_UNROLL = 4            # steps of k a GEMM's register tile takes per trip of its loop (see choose_opts) ...
GEMM_UNROLL_WORK = 1 << 27  # ... in a GEMM of this many multiply-adds or more (512^3, about a millisecond here)
ROW_TILE_MAX_DEPTH = 1024   # a GEMM whose threads' parts of B outgrow the L2 keeps its 64-row cache tiles only to this depth (see choose_opts)


@dataclass(frozen=True)
class Analysis:
  """What the heuristics know about a kernel. For each load b: `out_strides[b][k]` is its stride along output axis k
  (None for an axis of size 1), `reduce_strides[b]` its stride along the innermost reduced axis (None without a
  reduction), `inner[b]` whether it is read inside a reduction (then it runs reduce-size times per output: those are
  the loads that decide; a bias added after the sum is read once)."""
  shape: tuple[int, ...]
  reduce_sizes: tuple[int, ...]         # the innermost reduced size of every reduction in the kernel
  out_strides: tuple[tuple[int | None, ...], ...]
  reduce_strides: tuple[int | None, ...]
  inner: tuple[bool, ...]
  dtypes: frozenset                     # every dtype a value of the kernel has
  products: bool                        # an f32 sum of products (something fma helps)
  reduced: int = 1                      # the most elements any reduction reduces into each output (all its axes)
  stacked: bool = False                 # a STACK (a concatenation, a pad) is in it
  summed: tuple[bool, ...] = ()         # per load: its buffer is read by a reduction's terms (inner, or hoisted out of
                                        # the loop as loop-invariant: a one-hot's positions, compared with each index)

  @property
  def work(self) -> int:
    """Multiply-adds, about: the outputs times what is reduced into each (a convolution's window and channels both)."""
    return prod(self.shape) * max(1, self.reduced, prod(self.reduce_sizes))

  def deciding(self) -> list[int]:
    """The loads that decide: those inside a reduction when there is one, else all."""
    loads = range(len(self.inner))
    return [b for b in loads if self.inner[b]] if any(self.inner) else list(loads)

  def tile_axes(self, vector_axis: int) -> list[int]:
    """The output axes before the vector axis along which one deciding load moves and another is constant (a GEMM's
    rows: A moves, B is broadcast over them), so a tile along them reuses every loaded vector; for a sum of products."""
    deciding = self.deciding()
    # the load that moves may be one the sum's terms read outside its loop (a one-hot scatter's positions, the rows of
    # its output, compared with the indices inside: an embedding's gradient is a GEMM of the one-hot and the tokens' rows)
    moving = set(deciding) | {b for b, t in enumerate(self.summed) if t}
    axes = [k for k in range(vector_axis) if self.shape[k] > 1 and any(self.out_strides[b][k] == 0 for b in deciding)
            and any(self.out_strides[b][k] for b in moving)]
    return axes if self.products else []

  def tile_axis(self, vector_axis: int) -> int | None:
    """A GEMM's row axis: the last of tile_axes."""
    axes = self.tile_axes(vector_axis)
    return axes[-1] if axes else None


def analyze(kernel: Kernel) -> Analysis:
  """Lower the kernel plainly and read every load's strides (its index at each loop's counter 0 and 1)."""
  root, shape = kernel.canonical_root, kernel.root.shape
  nodes = root.toposort()
  reduces = [u for u in nodes if u.op is Ops.REDUCE and u.arg[1] > 0]
  sink = lower(root, kernel.canonical_out, Ctx(chunk_sums=False))   # one loop per reduced axis, a long sum's unsplit
  lin = sink.toposort()
  ranges = sorted((u for u in lin if u.op is Ops.RANGE), key=lambda r: r.arg)
  out_ranges = [r for r in ranges if r.arg.kind is AxisType.LOOP]
  reduce_ranges = {r for r in ranges if r.arg.kind is AxisType.REDUCE}
  axis_range: dict[int, UOp] = dict(zip([k for k, s in enumerate(shape) if s > 1], out_ranges))
  innermost = _innermost_reduce_ranges(lin)
  def stride(index: UOp, nodes: dict[UOp, None], r: UOp) -> int | None:
    if r not in nodes: return 0
    at = [_int_at(nodes, r, i) for i in range(3 if _size(r) > 2 else 2)]
    if any(a is None for a in at):   # a leaf other than a loop counter (a gather's loaded index): the rules decide
      zero = {q: UOp.const(0) for q in ranges}
      at = [simplify(index.substitute({**zero, r: UOp.const(i)})) for i in range(len(at))]
      if any(a.op is not Ops.CONST for a in at): return None
      at = [a.arg for a in at]
    # a step that changes (a 2x2 pooling window read as 4 positions: +1, then +31) is no stride: its lanes are a gather
    return at[1] - at[0] if len(at) == 2 or at[2] - at[1] == at[1] - at[0] else None
  def strides(index: UOp) -> tuple[tuple[int | None, ...], int | None, bool]:
    nodes = dict.fromkeys(index.toposort())     # (ordered, and a set)
    out = tuple(stride(index, nodes, axis_range[k]) if k in axis_range else None for k in range(len(shape)))
    red = next((s for r in innermost if (s := stride(index, nodes, r)) != 0), 0) if innermost else None
    return out, red, any(r in reduce_ranges for r in nodes)
  load_ops = [u for u in lin if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and u.src[0].src[0].op is Ops.BUFFER]
  loads = [u.src[0].src[1] for u in load_ops]
  terms = {b for r in reduces for b in r.src[0].toposort() if b.op is Ops.BUFFER}
  per_load = [strides(i) for i in loads]
  out_strides, reduce_strides, inner = (tuple(s[n] for s in per_load) for n in range(3))
  products = any(u.arg[0] is Ops.ADD and u.dtype is dtypes.f32 and _product(_under_movement(u.src[0])) for u in reduces)
  reduced = max((prod(u.src[0].shape[len(u.src[0].shape) - u.arg[1]:]) for u in reduces), default=1)
  return Analysis(shape, tuple(u.src[0].shape[-1] for u in reduces), out_strides, reduce_strides, inner,
                  frozenset(u.dtype for u in nodes), products, reduced, any(u.op is Ops.STACK for u in nodes),
                  tuple(u.src[0].src[0] in terms for u in load_ops))


def _int_at(nodes: dict[UOp, None], r: UOp, i: int) -> int | None:
  """An index's value with loop counter r at i and every other counter at 0, evaluated (what simplify folds the
  substituted index to, at a fraction of the cost: a cold GPT step's analysis simplified 2-3 copies of every load's index
  per axis); None when it reaches anything but constants, counters and integer arithmetic, or divides by zero."""
  vals: dict[UOp, int] = {}
  for u in nodes:
    if u.op is Ops.CONST: vals[u] = const_value(u)
    elif u.op is Ops.RANGE: vals[u] = i if u is r else 0
    elif u.op in _INT_ALU and u.dtype in (dtypes.i32, dtypes.bool):
      try: vals[u] = exec_alu(u.op, u.dtype, *[vals[s] for s in u.src])
      except EvalError: return None
    else: return None
  return vals[next(reversed(nodes))]

_INT_ALU = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.FLOORDIV, Ops.FLOORMOD, Ops.WHERE})


def _size(r: UOp) -> int:
  """A RANGE's trip count (0 when it isn't a constant)."""
  return r.src[0].arg if r.src[0].op is Ops.CONST else 0


def _under_movement(u: UOp) -> UOp:
  """The first node under u's movement ops (a weight gradient sums a permuted product)."""
  while u.op in MOVEMENT: u = u.src[0]
  return u


def _product(u: UOp) -> bool:
  """A product, or a value masked by a condition, where(c, x, 0), which is x times c as 0 or 1 (a one-hot's scatter: an
  embedding's gradient sums each token's gradient row into the row of its index): a sum of either is a GEMM's."""
  if u.op is Ops.MUL: return True
  return u.op is Ops.WHERE and (z := _under_movement(u.src[2])).op is Ops.CONST and z.arg == 0


def _innermost_reduce_ranges(lin: list[UOp]) -> list[UOp]:
  """The loops over each reduction's innermost axis, in loop order: of the reduce loops one END closes (a reduction's
  accumulator update, closed over all of its loops), the last (with plain Opts every axis is its own loop). A load read
  inside nested reductions counts along the outermost one's axis, where Opts.reduce_vector puts the lanes (a reduction
  inside another one's lanes keeps a scalar loop). (Every reduce loop of the innermost axis's size was one: a sum over
  (8, 32, 32), a convolution's weight gradient, was read along its rows, 32 floats a step, and kept scalar.)"""
  inner = set()
  for u in lin:
    if u.op is Ops.END and (loops := [r for r in u.src[1:] if r.op is Ops.RANGE and r.arg.kind is AxisType.REDUCE]):
      inner.add(max(loops, key=lambda r: r.arg))
  return sorted(inner, key=lambda r: r.arg)


def _contiguous_axis(analysis: Analysis, width: int) -> int | None:
  """The last output axis (of two or more) along which every load that matters is contiguous or constant, and one is
  contiguous, with 4 or more lanes dividing it; None when there is none."""
  deciding = analysis.deciding()
  for k in reversed(range(len(analysis.shape))):
    along = [analysis.out_strides[b][k] for b in deciding]
    if along and all(s in (0, 1) for s in along) and 1 in along and _lanes(analysis.shape[k], width) > 1: return k
  return None


def _lanes(n: int, width: int) -> int:
  """The most lanes (a power of two up to the vector width) that divide n; 1 when fewer than 4 do."""
  w = width
  while w >= 4 and n % w: w //= 2
  return w if w >= 4 else 1


UNROLL_WHOLE = 16   # a reduction's innermost axis this short is unrolled whole (no loop); a longer one left scalar gets a tile


@functools.lru_cache(maxsize=256)   # pure, and read by graph_rewrite at every realize (a tenth of a small op's Python)
def _register_tile(rows: int, vectors: int, registers: int) -> tuple[int, int]:
  """A GEMM's register tile (rows, vectors of accumulators), each dividing its axis, at most 8 x 3, whose accumulators,
  vectors of B and broadcast of A fit in `registers`: the most accumulators, then the fewest loads a step. 32 (AVX-512):
  8 x 3 or 8 x 2 (8 x 4 is 37 registers: gcc kept 5 accumulators on the stack; on an Intel AVX-512 machine, the loops
  alone, 8 x 4 at 1024^3 251 GFLOP/s against 286 for 8 x 2, and 341 for 8 x 3 at 1536^3). 16 (AVX2): 4 x 3, 6 x 2 or
  4 x 2 (8 x 2 is 19; on an AMD Zen 1, GEMM 256 and 512, the kernels alone: 55-63 GFLOP/s against 66-75 for 4 x 2)."""
  fits = [(r, v) for r in range(1, min(rows, 8) + 1) if rows % r == 0 for v in range(1, min(vectors, 3) + 1)
          if vectors % v == 0 and r * v + v + 1 <= registers]
  return max(fits, key=lambda t: (t[0] * t[1], -(t[0] + t[1])), default=(1, 1))


def _rows_first(analysis: Analysis, caps: Caps, last: int) -> bool:
  """Whether a GEMM splits its rows across threads rather than its column tiles: when B (the operand every row reads
  whole) fits in half an L2, each thread then reads only its half of A, which the kernel before it most likely wrote on
  the same core, and B from its own cache (the GPT's activation @ weight GEMMs of K = 128-512, 1024 rows: 120-170 ->
  200-240 GFLOP/s; on a 2 MiB L2, interleaved medians: 256^3 167 -> 192, 512^3 206 -> 226, 2048 x 384 x 384 182 ->
  221, 512 x 256 x 1024 200 -> 220, 128 x 512 x 512 the same). A deeper or wider B would be read from memory once per
  row tile (2048 x 1536 @ 1536 x 384: 154 -> 81; 1024^3: 116 -> 92), so those keep their column split."""
  cols = analysis.shape[last]
  depth = max(1, analysis.reduced, prod(analysis.reduce_sizes))
  return 4 * depth * cols <= caps.l2_bytes // 2


def _row_major_a(analysis: Analysis, row: int, last: int) -> bool:
  """Whether a GEMM (row axis `row`, vector axis `last`) reads its A row by row: every load constant along the columns
  and moving along the rows is contiguous along k (not an A packed into panels, nor one read down its columns)."""
  a = [b for b in analysis.deciding() if analysis.out_strides[b][last] == 0 and analysis.out_strides[b][row]]
  return bool(a) and all(analysis.reduce_strides[b] == 1 for b in a)


def _packed_b(analysis: Analysis, row: int, last: int, panel: int) -> bool:
  """Whether a GEMM (row axis `row`, vector axis `last`) reads a B packed into panels of `panel` columns (uopc.packing):
  a load constant along the rows, contiguous along the columns and `panel` apart along k, in a GEMM wider than a panel."""
  return bool(panel) and analysis.shape[last] > panel and any(
    analysis.out_strides[b][row] == 0 and analysis.out_strides[b][last] == 1 and analysis.reduce_strides[b] == panel for b in analysis.deciding())


def _costly_epilogue(kernel: Kernel) -> bool:
  """Whether the kernel computes a transcendental (exp, log, sin, a square root or a division) outside its reductions."""
  nodes = kernel.canonical_root.toposort()
  inside = {v for u in nodes if u.op is Ops.REDUCE for v in u.src[0].toposort()}
  return any(u.op in _COSTLY and u not in inside for u in nodes)


_COSTLY = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP})
TRANSPOSE_BLOCK = 32       # rows of a transposing copy walked inside each of its columns (16 where 32 doesn't divide them)


def _transposing_axis(analysis: Analysis, vector: tuple[int, int] | None, upcast: dict[int, int], caps: Caps) -> tuple[int, int] | None:
  """The axis of an elementwise kernel that copies a transposed view (a GEMM operand packed into panels: P[j // 8, k, j
  % 8] = A[k, j]) along which a load reads a new cache line every step (16 elements or more apart), for more steps than
  the L1 holds lines, while an axis outside it moves the load less: in output order, a line's other halves waited for
  the outer axis to come back round, and by then it had left the L1. Its blocks of TRANSPOSE_BLOCK (16 where 32 doesn't
  divide it) become the threads' loop, with the outer axis inside them and the block's rows innermost (copies of 2048 x
  1536, x 1152 and x 384 into panels of 8, alone: 1.33 -> 0.68, 0.86 -> 0.51 and 0.21 -> 0.14 ms with blocks of 16). With
  no vector, the last axis too (x.T copied, 2048 x 2048: 15.3 -> 1.41 ms; a + b.T). Blocks of 32 rather than 16: in a
  training step the copied operand comes from memory, and twice the rows a block keeps more lines in flight (nanoGPT's
  packs of 2048 x 1536 and x 1152 into panels of 8, timed inside its step, alternating: 1.55-1.57 -> 1.25-1.27 ms and
  1.12-1.15 -> 0.94 ms; x.T of 2048 x 2048 1.25-1.26 -> 1.16-1.23, of 4096 x 2048 2.69-2.77 -> 2.45-2.46). A copy
  into panels with vector lanes takes blocks along an axis the L1 holds a line of each step of too: the operand was
  most often just written by a kernel that split its rows across the threads, and in blocks along them each thread
  reads the rows its own core wrote, where a split of the panels read half of every one of them from the other core's
  cache (attention's gradient at N = 512, its packs of 512 x 512 into panels of 8 and of 32: 75 -> 45 us and 50 -> 37
  us; in a C harness after a kernel writing the rows split: 46 -> 19 us). (axis, block), or None for anything else."""
  if analysis.reduce_sizes or (vector is not None and vector[0] != len(analysis.shape) - 1): return None
  shape = analysis.shape
  for k in range(1, len(shape) if vector is None else len(shape) - 1):    # with lanes, never the vector's own axis
    block = next((b for b in (TRANSPOSE_BLOCK, TRANSPOSE_BLOCK // 2) if shape[k] % b == 0 and shape[k] // b >= caps.threads), None)
    if k in upcast or block is None or (vector is None and 64 * shape[k] <= caps.l1_bytes): continue
    for strides in analysis.out_strides:
      jump = strides[k]
      if jump is not None and abs(jump) >= 16 and any(s is not None and 0 < abs(s) < abs(jump) and shape[j] > 1
                                                              for j, s in enumerate(strides[:k])):
        return k, block
  return None


INNER_BLOCK = 16           # steps of an axis walked inside the innermost loop (Opts.inner): a line of 16 f32 each
INNER_MIN = 64             # elements the loops inside that axis walk, at least, for Opts.inner to pay


def _reread_axes(shape: tuple[int, ...], strides: list[tuple[int | None, ...]]) -> list[int]:
  """The axes before the last, of whole blocks of INNER_BLOCK steps and more than one, along which each of the loads
  whose `strides` are given reads the next element (its stride 1 or -1): where a gather's lines are read again."""
  return [k for k in range(len(shape) - 1) if shape[k] % INNER_BLOCK == 0 and shape[k] > INNER_BLOCK and all(s[k] in (1, -1) for s in strides)]


def _gathered_axis(analysis: Analysis, vector: tuple[int, int] | None, upcast: dict[int, int], thread: int | None) -> int | None:
  """The axis whose steps an elementwise kernel with a gathered vector walks innermost (Opts.inner, in blocks of
  INNER_BLOCK): a load whose lanes each read a cache line of their own (16 elements or more apart: v's gradient read
  transposed into the q, k and v gradients' concatenation) while the next step of an outer axis reads the next element
  of each of those lines. In output order the lines were read again only after the loops inside that axis had walked
  INNER_MIN elements or more, by then evicted (rows 256 floats apart share 4 of the L1's 64 sets): the concatenation of
  (8, 256, 1152) 0.99 -> 0.47 ms with the block's steps innermost. The axis nearest the vector's, else None."""
  if analysis.reduce_sizes or vector is None or vector[0] != len(analysis.shape) - 1: return None
  shape, last = analysis.shape, vector[0]
  for b in analysis.deciding():
    strides = analysis.out_strides[b]
    if strides[last] is None or abs(strides[last]) < INNER_BLOCK: continue
    for k in reversed(_reread_axes(shape, [strides])):
      if k != thread and k not in upcast and prod(shape[k + 1:]) >= INNER_MIN: return k
  return None


def _gather_copy(kernel: Kernel, analysis: Analysis, caps: Caps) -> Opts | None:
  """The Opts of an elementwise kernel all of whose loads read across its last axis (each lane a cache line of its own:
  x.T copied, attention's k packed into panels of k.T) on a machine with gathers (Caps.gather): vectors along the last
  axis, each one gather, and the axis along which every load reads contiguously walked innermost in blocks of
  INNER_BLOCK (Opts.inner), so that each line gathered serves the block's steps while it is in the L1. Threads split
  an axis before that one, else the last axis's blocks of two vectors. None where it doesn't apply: the scalar copies
  of _transposing_axis then (x.T of 2048 x 2048: 1.04 -> 0.77 ms; k's pack, (8, 6, 8, 64, 32) from (8, 256, 1152):
  176 -> 134 us, alone)."""
  shape, n, w = analysis.shape, len(analysis.shape), caps.vector_width
  if not caps.gather or analysis.reduce_sizes or analysis.stacked or n < 2 or not analysis.dtypes <= {dtypes.f32, dtypes.i32} or shape[-1] % w:
    return None
  strides = [analysis.out_strides[b] for b in analysis.deciding()]
  if not strides or any(s[-1] is None or abs(s[-1]) < INNER_BLOCK for s in strides): return None
  if not (reread := _reread_axes(shape, strides)): return None
  a = reread[-1]
  thread, tile = None, {}
  if caps.threads > 1 and analysis.work >= LINE_COPY_MIN_WORK:
    thread = next((k for k in range(n - 1) if k != a and shape[k] >= caps.threads), None)
    if thread is None and shape[-1] % (2 * w) == 0 and shape[-1] // (2 * w) >= caps.threads: thread, tile = n - 1, {n - 1: 2 * w}
  opts = Opts(vector=(n - 1, w), thread=thread, tile=tile, inner={a: INNER_BLOCK})
  try: check_opts(kernel.canonical_root, opts)
  except LowerError: return None
  return opts


def _first_valid(root: UOp, caps: Caps, choices: list[Opts]) -> Opts | None:
  """The first of `choices` that fits the kernel and the machine's blocks."""
  for o in choices:
    if block_threads(o) > caps.max_local or (o.tc and not caps.tensor_cores): continue
    try:
      check_opts(root, o)
      return o
    except LowerError: pass
  return None


# the GPU shapes the heuristics try, best first, and the search's candidates around them: tensor-core GEMMs as (warps on i, warps on j,
# 16x8 tiles per warp on i, on j); staged GEMMs as (threads on i, on j, outputs per thread on i, on j, the tiles' depth); threads sharing a reduction
TC_TILES = ((2, 2, 2, 4), (2, 2, 1, 2), (1, 1, 2, 2), (1, 1, 1, 1))
# pipelined tensor-core GEMMs (uopc.gpulower: operands through shared memory by cp.async, ldmatrix) as (warps on i, on j,
# tiles per warp on i, on j, stages): a 128x128 block of 4 warps of 64x64 in 4 stages first, then 8 warps of 32x64,
# 128x256 of 8 warps of 64x64, and smaller blocks for the sizes those don't divide. On an H200, an f16 GEMM 8192 (the
# median of 7 launches each): 420 TFLOP/s for the first, 338 for 8 warps of 32x64 in 3 stages (the first choice
# before), 360-369 for 128x256 and 256x128, 237-269 for 64x64 blocks; 3 or 5 stages instead of 4: 396, 408
PIPELINED_TC = ((2, 2, 4, 8, 4), (4, 2, 2, 8, 3), (2, 4, 4, 8, 3), (2, 2, 2, 4, 3), (1, 1, 2, 4, 2))
STAGED_TILES = ((16, 16, 4, 4, 16), (16, 16, 2, 2, 16), (8, 8, 2, 2, 8), (8, 8, 1, 1, 8), (4, 4, 1, 1, 4))
# blocks a staged GEMM's tile should give at least: half an H200's 132 multiprocessors. f32 on an H200: a GPT's weight
# gradient of 128 x 512 x 1024 took 95 us as 16 blocks of 64 x 64, 61 us as 256 blocks of 16 x 16; but 1024 x 512 x 128
# took 30 us as 128 blocks of 64 x 64 and 40 us as 512 of 32 x 32, and 1536 x 384 x 2048 (144 blocks of 64 x 64) 244
# us, no tile of the list doing better by more than 20%
MIN_BLOCKS = 64
GROUPS = (256, 128, 64, 32, 16)
# a block per output element only while there are few enough outputs that a thread each would leave the GPU idle (an
# H200's 132 multiprocessors take 2,048 threads each); past this, a thread per output runs its sum alone (a GPT's
# gradient through its 65-symbol head: 786,432 outputs of 65 products each took 0.59 ms as blocks of 65 threads)
GROUP_OUTPUTS = 32768


def choose_gpu_opts(kernel: Kernel, caps: Caps) -> Opts:
  """Opts for a GPU (see uopc.gpulower for what each shape of kernel becomes):

  * a GEMM of f16 operands on a GPU with tensor cores: WMMA, its operands through shared memory in a pipeline of 4 stages
    of cp.async copies read with ldmatrix, 2x2 warps per block each with 4x8 tiles of 16x8 (a 128x128 output tile per
    block), smaller blocks when the sizes don't divide (PIPELINED_TC); where the operands are no plain reads of memory
    (a fused producer), fragments straight from memory, 2x2 warps of 2x4 tiles (TC_TILES);
  * another GEMM: 16x16 threads per block, each with a 4x4 register tile, operand tiles 16 deep in shared memory, or a
    smaller tile where that leaves multiprocessors without a block (MIN_BLOCKS);
  * a long reduction (its innermost axis 64 or more) into at most GROUP_OUTPUTS elements: a block per output element,
    its threads sharing the reduction (a reduction nested in another runs whole in each thread: outer_reductions);
  * anything else: a thread per output element, up to 256 threads per block along the last axes."""
  root, shape = kernel.canonical_root, kernel.root.shape
  fma = caps.fma and analyze(kernel).products
  def opts(**kw) -> Opts: return Opts(gpu=True, fma=fma and not kw.get("tc", False), **kw)
  choices: list[Opts] = []
  if (g := gemm_pattern(root)) is not None:
    i, j = g.i, g.j
    if g.f16 and caps.tensor_cores:
      choices += [opts(tc=True, stage=s, local={i: wi, j: wj}, upcast={i: ui, j: uj}) for wi, wj, ui, uj, s in PIPELINED_TC]
      choices += [opts(tc=True, local={i: wi, j: wj}, upcast={i: ui, j: uj}) for wi, wj, ui, uj in TC_TILES]
    # the largest tile that still gives every multiprocessor a block (a weight's gradient of 128 x 512 summed over
    # 1,024 rows is 16 blocks of 64 x 64); without one, the tile of the most blocks
    blocks = lambda t: prod(shape) // (shape[i] * shape[j]) * (shape[i] // (t[0] * t[2])) * (shape[j] // (t[1] * t[3]))
    few = sorted((t for t in STAGED_TILES if blocks(t) < MIN_BLOCKS), key=lambda t: -blocks(t))
    tiles = [t for t in STAGED_TILES if blocks(t) >= MIN_BLOCKS] + few
    choices += [opts(stage=s, local={i: li, j: lj}, upcast={i: ui, j: uj}) for li, lj, ui, uj, s in tiles]
  reduces = outer_reductions(root)
  if reduces and min(u.src[0].shape[-1] for u in reduces) >= 64 and prod(shape) <= GROUP_OUTPUTS:
    inner = math.gcd(*(u.src[0].shape[-1] for u in reduces))
    # powers of two first (a warp is 32 threads), then any divisor of 16 or more (a softmax over 200 classes)
    choices += [opts(group=n) for n in GROUPS] + [opts(group=divisor_at_most(inner, 256))] * (divisor_at_most(inner, 256) >= 16)
  # a thread per output element: threads on the last axis (and the one before, when the last is short)
  dims = [k for k in range(len(shape)) if shape[k] > 1]
  if dims:
    last = dims[-1]
    t = max(d for d in range(1, min(shape[last], 256) + 1) if shape[last] % d == 0)
    local = {last: t}
    if t < 32 and len(dims) > 1:
      prev = dims[-2]
      local[prev] = max(d for d in range(1, min(shape[prev], 256 // t) + 1) if shape[prev] % d == 0)
    choices += [opts(local=local), opts(local={last: t})]
  choices.append(opts())
  return _first_valid(root, caps, choices) or Opts(gpu=True)


def choose_opts(kernel: Kernel, caps: Caps) -> Opts:
  """The Opts to lower `kernel` with on a machine described by `caps` (see the module docstring)."""
  if not isinstance(kernel, Kernel) or not isinstance(caps, Caps):
    raise LowerError(f"choose_opts takes a Kernel and Caps, got {type(kernel).__name__} and {type(caps).__name__}")
  if caps.gpu: return choose_gpu_opts(kernel, caps)
  if caps.vector_width <= 1 and caps.threads <= 1: return Opts()
  analysis = analyze(kernel)
  if not analysis.shape and not analysis.reduce_sizes: return Opts()
  vectorizable = analysis.dtypes <= {dtypes.f32, dtypes.i32, dtypes.bool}     # f16 stays scalar
  shape, n = analysis.shape, len(analysis.shape)
  upcast: dict[int, int] = {}
  tile: dict[int, int] = {}
  vector, reduce_vector, unroll, row = None, 1, 1, None
  last = n - 1 if n else None
  deciding = analysis.deciding()
  # the last axis is a vector axis when the loads that matter read it contiguously (stride 1) or not at all (0): the
  # output is contiguous along it anyway. A load that jumps along it would be a gather of every lane
  along_last = [analysis.out_strides[b][last] for b in deciding] if last is not None and shape[last] > 1 else []
  # An elementwise kernel may have a gather among them, one in three loads at most (a concatenation of q, k and v's
  # gradients, k's read transposed): its vector loads and store beat a scalar loop that loads all three
  gathers = sum(s not in (0, 1) for s in along_last)
  contiguous_last = bool(along_last) and (1 in along_last or not analysis.reduce_sizes) and \
    (gathers == 0 or (not analysis.reduce_sizes and along_last.count(1) >= 2 * gathers))
  along_reduce = [analysis.reduce_strides[b] for b in deciding] if analysis.reduce_sizes else []
  if (gathered := _gather_copy(kernel, analysis, caps)) is not None: return gathered
  if vectorizable and caps.vector_width > 1 and contiguous_last and (w := _lanes(shape[last], caps.vector_width)) > 1:
    vector = (last, w)
    rows = analysis.tile_axes(last)     # a GEMM's row axis is the last of them (tile_axis)
    row = rows[-1] if rows else None
    # a GEMM's register tile (rows x vectors of accumulators, _register_tile); a sum down rows of 32 vectors or more 4 vectors,
    # each row's read 256 B (the sum over 2048 rows of 1536 on AVX-512: 444 -> 316-338 us); anything else 2 vectors an iteration
    if row is not None: upcast[row], vectors = _register_tile(shape[row], shape[last] // w, caps.vector_registers)
    elif analysis.reduce_sizes and shape[last] % (4 * w) == 0 and shape[last] >= 32 * w: vectors = 4
    else: vectors = 2 if shape[last] % (2 * w) == 0 else 1
    if vectors > 1: upcast[last] = vectors
    if row is not None:
      # other tile axes along which the *other* operand is the constant one (a convolution's output channels: the weights
      # move, the input doesn't). An axis where the same operand is constant as along the row axis (a linear layer on
      # (batch, tokens, features): both are rows of x under one weight) is more rows of one GEMM, tiled as a GEMM: as a
      # second axis of 4 it made 32 accumulators, 3 more registers than AVX-512 has (the default GPT's MLP up
      # projection, 1024 x 512 from 128, ran at 145 GFLOP/s, 13% of its jitted step). Nor an axis whose constant loads
      # are all constant along the rows too (attention's batch axis, where only a bias added to q is: its q and k both
      # move, so a tile over it shares no loaded vector and only multiplies the accumulators, 32 in nanoGPT's scores).
      # Nor an axis along which the operand constant along the vector axis is too: more columns of one GEMM (a linear
      # layer read as heads, (batch, heads, tokens, head size): 6 heads x 2 rows x 1 vector, 143 GFLOP/s in nanoGPT)
      fixed = lambda k: frozenset(b for b in deciding if analysis.out_strides[b][k] == 0)
      more = [k for k in rows if k != row and fixed(k) - fixed(row) - fixed(last)]
      if more and caps.vector_registers >= 32:
        # a convolution (its output channels are another tile axis: the weights move along them, the input doesn't) on
        # a machine of 32 vector registers: 8 output channels x 2 rows x one vector, 16 accumulators, so each loaded
        # input vector feeds 8 channels' FMAs and each weight 2 rows'. A second vector a row needs fewer rows, and each
        # weight then feeds fewer FMAs (whole conv2d, best of 2-3 runs alternating: 4 rows x 2 vectors x 4 channels
        # 2.92-3.03 ms, 2 x 2 x 8 2.59-2.64, 4 x 1 x 8 2.50). Not 4 rows, 32 accumulators, since a window's 9
        # multiply-adds an accumulator are made step by step across the accumulators (uopc.linearize): 32 of them with
        # their loaded vectors and weights outgrow the registers (batch 8, 64 -> 64 channels, 32 x 32, 3 x 3, the
        # kernel's UOPC_DEBUG median in 3 runs alternating: 8 x 4, one accumulator's chain after another, 3.66-3.80 ms;
        # 8 x 2 step by step 2.83-3.32. The whole call at 128 channels 15.6-16.9 -> 12.7-13.3 ms, at 32 1.54-1.63 ->
        # 1.31-1.43; a 1 x 1 convolution, whose chains are one step long, 0.46-0.63 ms with either tile)
        upcast.pop(last, None)
        upcast[more[-1]] = divisor_at_most(shape[more[-1]], 8)
        upcast[row] = divisor_at_most(shape[row], max(1, 16 // upcast[more[-1]]))
      # 16 registers (AVX2): 4 channels x the tile's vectors (and rows) to 8 accumulators (the same conv2d on an AMD
      # Zen 1: 4 x 1 x 2 7.9 ms, 4 x 2 x 1 8.6, 2 x 4 x 1 8.1; 4 rows x 2 vectors alone 12.2; 2 x 4 x 2 spilled, 13.3)
      elif more:
        upcast[more[-1]] = divisor_at_most(shape[more[-1]], 4)
        upcast[row] = divisor_at_most(shape[row], max(1, 8 // (upcast[more[-1]] * upcast.get(last, 1))))
      # a cache tile of 64 rows: each thread's column panel of B is walked by 64 rows of A at a time while both stay in
      # its L2 (GEMM 1024: 184 -> 209 GFLOP/s; no change at 512 and below). Not in a batch of GEMMs (attention's, over
      # batch and heads: both operands move along the leading axes): there each GEMM's B is its own and small, and the
      # tile's loop, outside the threads' (a block of every GEMM's rows at a time), read all of them again for each
      # block (nanoGPT's 48 of 256 x 256 @ 256 x 64: 171 -> 180 GFLOP/s without it)
      batched = any(shape[k] > 1 and k not in rows for k in range(row))
      if not batched and shape[row] >= 256 and shape[row] % 64 == 0 and 64 % upcast[row] == 0: tile = {row: 64}
      # its loop over k unrolled where the accumulators leave half the registers free: a step of 8 x 2 is 2 vector loads,
      # 8 broadcasts and 16 FMAs (AVX-512), and the loop's own index arithmetic, compare and prefetches were a fifth of
      # the instructions around them (GEMM 512 1.05x, 1024 1.03-1.06x, the whole call). 8 x 3 (24 accumulators) unrolled
      # had gcc keep two of them on the stack: nanoGPT's MLP projections 9-13% slower. Only a GEMM that runs long enough
      # to earn back its copies: lowering, proving and compiling them is ~10 ms the first time (a cold default GPT step,
      # whose 22 such GEMMs do 8-67 million multiply-adds each, 0.90 -> 1.14 s; its jitted step 1% faster), which a GEMM of
      # a millisecond or more wins back in a few hundred launches
      if analysis.reduce_sizes and 2 * prod(upcast.values()) <= caps.vector_registers and analysis.work >= GEMM_UNROLL_WORK:
        unroll = divisor_at_most(math.gcd(*analysis.reduce_sizes), GEMM_UNROLL)
  elif vectorizable and caps.vector_width > 1 and analysis.reduce_sizes and all(s in (0, 1) for s in along_reduce):
    w = min(_lanes(r, caps.vector_width) for r in analysis.reduce_sizes)
    if w > 1:
      reduce_vector = w
      unroll = divisor_at_most(min(analysis.reduce_sizes) // w, 4) if all(r % (w * 4) == 0 for r in analysis.reduce_sizes) else 1
      unroll = unroll if all(r % (w * unroll) == 0 for r in analysis.reduce_sizes) else 1
      # a GEMM read as dot products (x @ w.T for a few rows of x: both operands contiguous along k) gets a register
      # tile: the shortest axis along which one operand is constant (the rows of x, over which w's vectors repeat)
      # DOT_ROWS rows, another such axis 2, so each vector of w loaded feeds DOT_ROWS accumulators and w streams from
      # memory once instead of once per row (a decode step's 16 x 384 @ 384 x 1536: 61 -> 170 GFLOP/s, unpacked)
      if (axes := analysis.tile_axes(n)) and len(analysis.reduce_sizes) == 1:
        rows = min(axes, key=lambda k: shape[k])
        # 16 accumulators where the machine has 32 vector registers (AVX-512), DOT_ROWS where it has 16
        other = [k for k in axes if k != rows][-1:] if caps.vector_width >= 16 else []
        # only where at least half the loads are shared across the tile (a GEMM's: each operand is broadcast along an
        # axis of it). A reduction whose loads move along every output axis but one weight's (a layer norm's gradient,
        # sum over 128 of (x - mean) * rstd * w * dy, (16, 64) outputs) loads nearly as many vectors per multiply-add
        # tiled as not (2 per output and 1 per tile, against 3 per output), and the tile's 16 accumulators with their
        # horizontal sums were 30 KB of C a kernel: a fifth of a cold GPT step's gcc time, for 0.4 ms of its 25
        if 2 * sum(any(analysis.out_strides[b][k] == 0 for k in [rows, *other]) for b in deciding) >= len(deciding):
          upcast[rows] = divisor_at_most(shape[rows], DOT_ROWS)
          if other: upcast[other[0]] = divisor_at_most(shape[other[0]], 2)
          unroll = 1
      # output axes along which no load moves, in a kernel with a STACK, are where a branch is chosen (a convolution's
      # weight gradient, out[o, c, kh, kw]: each of x's 9 window positions is a load of its own and the position picks
      # one): few enough, they are unrolled whole instead, so that each copy loads its one branch, not all 9 to pick
      # one (8 x 64 x 32 x 32, 3 x 3: 11.4 -> 6.5 ms)
      branches = [k for k in range(n) if shape[k] > 1 and all(analysis.out_strides[b][k] == 0 for b in deciding)] if analysis.stacked else []
      if branches and prod(shape[k] for k in branches) <= UNROLL_WHOLE:
        upcast, unroll = {k: shape[k] for k in branches}, 1
  elif vectorizable and caps.vector_width > 1 and analysis.reduce_sizes and (k := _contiguous_axis(analysis, caps.vector_width)) is not None:
    # a reduction read contiguously along an earlier output axis only (an embedding's gradient: sum over the tokens of
    # (token == v) * dx[token, c], computed as (c, v)): lanes along that axis; only the store scatters, once per output
    # (1024 scalar compares and adds per output were 2.4 GFLOP/s)
    vector = (k, _lanes(shape[k], caps.vector_width))
    # and a register tile along a later axis where the loads that move along the vector axis are constant and another
    # moves (a convolution's input gradient, (n, h, w, c, 9 window positions) summed over the output channels: each
    # vector of the output's gradient feeds the 9 positions' FMAs; 24.8 -> 4.6 ms, 8 x 64 x 32 x 32, 3 x 3)
    moving = [b for b in deciding if analysis.out_strides[b][k]]
    reuse = [j for j in range(k + 1, n) if shape[j] > 1 and all(analysis.out_strides[b][j] == 0 for b in moving)
             and any(analysis.out_strides[b][j] for b in deciding)] if analysis.products else []
    if reuse: upcast[reuse[-1]] = divisor_at_most(shape[reuse[-1]], 16 if caps.vector_width >= 16 else 8)
  # a reduction left scalar (its operands read across the reduced axis: an MLP's logits, x @ W2 with W2 10 columns wide)
  # sums each output in one chain of dependent multiply-adds, one FMA latency a step; a tile of the last output axis
  # runs up to 16 chains side by side on one load of the operand that doesn't move along it (the logits, 256 x 10
  # from K = 256: 0.28 -> 0.045 ms). Each output still sums in order. Not where the reduction is unrolled whole (below):
  # its copies are chains side by side already, and a tile would multiply the straight-line code
  reduce_sizes = analysis.reduce_sizes
  if vector is None and reduce_vector == 1 and not upcast and last is not None and reduce_sizes and min(reduce_sizes) > UNROLL_WHOLE \
     and (chains := divisor_at_most(shape[last], 16)) > 1 and any(analysis.out_strides[b][last] == 0 for b in deciding):
    upcast[last] = chains
  # a short innermost reduced axis (a convolution's window positions) is unrolled whole: no loop, and the STACK that picks a
  # window becomes a constant choice in each copy. A reduction over nothing (an empty matmul fused into a sum) has none: 0 < short
  if reduce_vector == 1 and reduce_sizes and 0 < (short := reduce_sizes[0]) <= UNROLL_WHOLE and all(r % short == 0 for r in reduce_sizes):
    unroll = short
  fma, thread = caps.fma and analysis.products, None
  # a copy whose elements each read a cache line of their own, one lane at a time (a small transposing copy: attention's
  # k packed into panels, 32K elements, 21 -> 14 us) does a vector kernel's work per element: threaded from a quarter
  strided = lambda: vector is None and not reduce_sizes and any(s and s[-1] is not None and abs(s[-1]) >= 16 for s in analysis.out_strides)
  if caps.threads > 1 and (analysis.work >= THREAD_MIN_WORK or (analysis.work >= LINE_COPY_MIN_WORK and strided())):
    step = lambda k: upcast.get(k, 1) * (vector[1] if vector is not None and vector[0] == k else 1)
    # a GEMM splits its column tiles across threads (each thread keeps its panel of B in its own cache); anything
    # else its outermost axis with an iteration for every thread
    order = ([last] if vector is not None and upcast.get(last) and row is not None and not _rows_first(analysis, caps, last) else []) + list(range(n))
    # a GEMM read as dot products splits its longest axis (a decode step's w, not its 16 rows: each thread streams half
    # of w instead of all of it)
    if reduce_vector > 1 and upcast: order = sorted(range(n), key=lambda k: -(shape[k] // step(k)))
    thread = next((k for k in order if shape[k] // step(k) >= caps.threads), None)
    # a GEMM whose threads split its rows (its row axes: a linear layer on (batch, tokens, features)) walks each
    # column panel of B down all of a thread's rows before the next panel (a tile of one register tile's columns): the
    # panel stays in the L1 while A's rows stream past it, where row by row every panel of B came from the L2 again for
    # each row tile (the default GPT's 1024-row GEMMs 6-9% faster). Not in a batch of GEMMs, each with a B of its own
    # (attention's: nanoGPT's step was 5% slower), nor under a costly epilogue (a GELU's gradient, exp and a division a
    # value): it then reads and stores a row at a time, and lost 10% more than the GEMM gained
    if row is not None and vector is not None and thread is not None and thread != last and upcast.get(last) and \
       not any(shape[k] > 1 and k not in rows for k in range(row)) and shape[last] > (cw := step(last)) and not _costly_epilogue(kernel):
      tile[last] = cw
      # ... unless its B is a packed copy (panels of caps.gemm_panel columns) at least as large as A. Its columns are
      # split instead, in one block a thread, each walking its block's panels row block by row block. Found where the
      # pack kernel gave each thread the panels of its part of the columns, so that rows split read half of B from the
      # other core's cache (GEMM 512, the whole call: 920-928 -> 902-905 us; in a C harness packing B before every call,
      # 797 -> 756 us the GEMM alone). Packs now split their rows (_transposing_axis), so either split reads half of B
      # from the other core; the column split still measured 2% ahead (903-912 against 922-931 us, 5 runs alternating).
      # Each thread reads all of A: where A is the larger (attention's p @ v, 512 x 512 @ 512 x 64) that cost more than
      # it saved, 143 -> 309 us. And, as the walk, not under a costly epilogue: attention's scores so split (the softmax
      # after them splits rows, and read half of them from the other core): its forward 452 -> 485 us
      if thread == row and shape[last] % (cw * caps.threads) == 0 and shape[last] >= prod(shape[k] for k in rows) and \
         _packed_b(analysis, row, last, caps.gemm_panel):
        thread, tile[last] = last, shape[last] // caps.threads
    # a GEMM whose threads split its columns (B too large for half an L2) and whose rows are walked in cache tiles made
    # a parallel region of each row tile: its columns go in one block a thread instead, that thread's loop the outermost,
    # each 8 rows walking the thread's columns, where the thread's part of B and a row tile of A fit in most of its L2
    # (nanoGPT's projections, the kernel alone: 2048 x 384 @ 384 x 1536 7.42 -> 7.22 ms, 2048 x 1536 @ 1536 x 384 7.29 ->
    # 7.04, 2048 x 1152 @ 1152 x 384 5.50 -> 5.37). With more of B a thread (1024^3: 2 MiB) its columns came from L3
    # again for every 8 rows (6.64 -> 6.87 ms; 2048^3 54 -> 76 ms)
    # Where they don't fit, the row tiles go too once the sum is deeper than ROW_TILE_MAX_DEPTH: each thread then walks
    # one column panel of B down all the rows, the panel staying in its L2 while A streams past, where a block of 64
    # rows (512 KB of A at K = 2048) walked every panel of the thread's part, each panel from L3 again for each block
    # (alternating, the calls alone: 2048^3 54.4 -> 52.2-52.7 ms, 1536^3 23.3-24.0 -> 22.3-22.5, 1024 x 4096 @ 4096 x
    # 1024 27.6 -> 26.4, 1536 x 2048 @ 2048 x 384 7.44 -> 7.16-7.23, 384 x 2048 @ 2048 x 1536 7.97-8.01 -> 7.57-7.59;
    # at K = 1024 and 1152 the same either way; shallower sums keep them: 4096 x 256 @ 256 x 4096 26.2-26.5 against
    # 28.3-28.8 ms without, 2048 x 512 @ 512 x 2048 13.4 against 14.3-14.4). Only where A is read row by row
    # (_row_major_a): a weight's gradient over 2048 tokens, its A packed into panels of 8 rows (dy.T), kept them (alone,
    # 1536 x 384 and 1152 x 384: 7% slower without)
    elif thread == last and row in tile:
      depth = max(1, prod(analysis.reduce_sizes))
      if shape[last] % (step(last) * caps.threads) == 0 and 4 * depth * (shape[last] // caps.threads + tile[row]) <= caps.l2_bytes * 4 // 5:
        tile[last] = shape[last] // caps.threads
      elif depth > ROW_TILE_MAX_DEPTH and _row_major_a(analysis, row, last): del tile[row]
  if (transposing := _transposing_axis(analysis, vector, upcast, caps)) is not None:
    k, block = transposing
    tile = {k: block}
    if thread is not None: thread = k
  inner = {k: INNER_BLOCK} if tile == {} and (k := _gathered_axis(analysis, vector, upcast, thread)) is not None else {}
  # a concatenation's kernel (the q, k and v gradients joined, a convolution's padding) splits its last loop where the
  # branch changes: each piece loads one branch at a plain index (a 3x3 convolution's padding: 0.91 -> 0.23 ms). Where
  # it can't (a reduction, the last axis threaded or tiled), check_opts refuses it and the same choice without it is next
  full = Opts(upcast=upcast, vector=vector, reduce_vector=reduce_vector, unroll=unroll, fma=fma, thread=thread, tile=tile, inner=inner)
  choices = [dataclasses.replace(full, split=True)] * analysis.stacked + [full, Opts(upcast=upcast, vector=vector, fma=fma, thread=thread),
                                                                         Opts(thread=thread)]
  # the heuristics never hand out invalid Opts: when the full choice doesn't fit the kernel, keep what does
  for opts in choices:
    try:
      check_opts(kernel.canonical_root, opts)
      return opts
    except LowerError: pass
  return Opts()


def graph_rewrite(caps: Caps) -> GemmPacking | None:
  """What `caps`' machine wants done to a graph before kernelize fuses it (kernelize's `rewrite`): GEMM operands packed
  into panels of caps.gemm_panel columns on a CPU that asks for them; None (the graph as written) elsewhere. A GPU
  stages its own operand tiles (uopc.gpulower), and a packed f32 copy of an f16 operand would hide the GEMM's f16 from
  the tensor cores."""
  if not caps.gemm_panel: return None
  return GemmPacking(caps.gemm_panel, _register_tile(PACK_ROWS, 2, caps.vector_registers)[0], caps.l2_bytes, caps.vector_width)


def candidates(kernel: Kernel, caps: Caps, base: Opts, limit: int = 12) -> list[Opts]:
  """Valid Opts around `base` (the heuristics' choice) for a timed search to try, `base` first. On a CPU: other register
  tiles (rows and vector copies), vector widths, unrolling, thread axes, a cache tile on the row axis, and no vectors at
  all. On a GPU (a base with gpu=True): a GEMM's other tensor-core and staged tiles, other numbers of threads sharing a
  reduction, other numbers of threads per block."""
  shape, root = kernel.root.shape, kernel.canonical_root
  up = dict(base.upcast)
  out: list[Opts] = [base]
  def add(**changes) -> None:
    """base with `changes`, every other field kept, when that is a valid Opts for the kernel and the machine not yet
    among the candidates."""
    try: o = dataclasses.replace(base, **changes)
    except LowerError: return
    if o in out or block_threads(o) > caps.max_local or (o.tc and not caps.tensor_cores): return
    try: check_opts(root, o)
    except LowerError: return
    out.append(o)
  if base.gpu:
    _gpu_candidates(root, caps, base, add)
    return out[:limit]
  if base.vector is not None:
    vaxis, w = base.vector
    rows = [k for k in up if k != vaxis]
    for r in rows:
      for f in (2, 4, 8, 16): add(upcast={**up, r: f})
    for c in (1, 2, 4): add(upcast={**up, vaxis: c})
    if w > 4: add(vector=(vaxis, w // 2), upcast={**up, vaxis: up.get(vaxis, 1) * 2})
    for r in rows:
      for t in (64, 128, 256):
        if shape[r] > t: add(tile={r: t})
  if base.reduce_vector > 1:
    for u in (1, 2, 4, 8): add(unroll=u)
    add(reduce_vector=base.reduce_vector // 2, unroll=base.unroll * 2)
  for k in range(len(shape)):
    if k != base.thread: add(thread=k)
  add(vector=None, reduce_vector=1, upcast={}, unroll=1)
  return out[:limit]


def _gpu_candidates(root: UOp, caps: Caps, base: Opts, add) -> None:
  """candidates' GPU half: `add(**changes)` keeps what is valid."""
  if (g := gemm_pattern(root)) is not None:
    i, j = g.i, g.j
    # a tensor-core GEMM's accumulation is the hardware's; a staged one sums products, fused where the machine can
    # (the base's other pipeline depths, the other pipelined blocks, two of each other kind; then the rest)
    if base.tc and base.stage:
      for s in (2, 3, 4): add(stage=s)
    for wi, wj, ui, uj, s in PIPELINED_TC * g.f16: add(tc=True, stage=s, fma=False, local={i: wi, j: wj}, upcast={i: ui, j: uj})
    tc = [dict(tc=True, stage=0, fma=False, local={i: wi, j: wj}, upcast={i: ui, j: uj}) for wi, wj, ui, uj in TC_TILES * g.f16]
    staged = [dict(tc=False, stage=s, fma=caps.fma, local={i: li, j: lj}, upcast={i: ui, j: uj}) for li, lj, ui, uj, s in STAGED_TILES]
    for changes in tc[:2] + staged[:2] + tc[2:] + staged[2:]: add(**changes)
  if base.group > 1:
    for n in GROUPS + (512, 1024): add(group=n)
  if not (base.tc or base.stage or base.group > 1) and base.local:
    local = dict(base.local)
    for axis in local:
      for t in (32, 64, 128, 256, 512, 1024): add(local={**local, axis: t})


__all__ = ["Caps", "Analysis", "analyze", "choose_opts", "choose_gpu_opts", "candidates", "graph_rewrite", "GemmPacking", "THREAD_MIN_WORK",
           "TC_TILES", "PIPELINED_TC", "STAGED_TILES", "MIN_BLOCKS", "GROUP_OUTPUTS",
           "PACK_STRIDE", "PACK_BIG", "PACK_MID", "PACK_MID_ROWS", "PACK_MIN_ROWS", "PACK_ROWS", "PACK_MIN_DEPTH", "PACK_MIN_WORK"]
