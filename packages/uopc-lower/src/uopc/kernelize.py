"""Kernelize: a shaped graph with one or more outputs -> a schedule of kernels over temporary buffers.

rangeify can lower any shaped graph as one loop nest, but one loop nest is not always a good program. A
reduction evaluated inside a loop it doesn't depend on is recomputed on every iteration of that loop:
fused attention computes each row of QK^T once per output column (N times the work: at N=512, hundreds of times slower). The
cure is to *materialize*: compute the value once into a temporary BUFFER, in a kernel of its own, and let its
consumers LOAD it. `STAGE(x)` is the IR's mark for "materialize x"; kernelize turns every STAGE, and every
node its rules decide to materialize, into a temporary BUFFER written by its own kernel.

The rules (tinygrad's, which never recompute a reduction per output element):
  * a REDUCE whose value is broadcast (an EXPAND that grows an axis, reached through elementwise and movement
    ops) is materialized: its consumer would otherwise revisit it from inside loops it doesn't use. Where a cheap
    epilogue of its own alone lies on the way (a linear layer's bias), the value with the epilogue is what is stored,
    in the reduction's kernel: its readers load it rather than redo the epilogue for each copy;
  * so is a REDUCE that reaches a STACK (a concatenation: a pad's zeros beside it, a convolution window's shifted
    views of it): under the choice of branch it would run once per branch that reads it (nine times for a 3x3
    window), in loops no Opts can vectorize;
  * so is the value a reduction reads when a sum of products (a GEMM, a convolution) is in it, reached without a
    broadcast (a global pooling of a convolution, a loss's sum of a GEMM, a layernorm of a residual stream), and
    of two sums of products joined whose innermost axes differ, one a short window (a residual block's 3x3 and 1x1
    convolutions), all but the largest: nested in another reduction's loops, or beside another reduction of other
    sizes, no Opts give a sum of products its vectors, register tiles and unrolled window;
  * so is a costly elementwise value that is broadcast (COSTLY ALU ops, a transcendental among them): a GELU's
    gradient feeding a weight gradient would otherwise be recomputed once per output column; and a concatenation of
    values read from memory broadcast 8 times or more (the q, k and v gradients joined for a projection's two GEMMs:
    each product chose its branch again);
  * a node shared by several kernels is materialized when recomputing it costs more than loading it: when its
    kernel-local graph holds a REDUCE or a GATHER (dependent loads: an embedding's rows, which a GPT's first block's
    kernels would each pick again), reads more than MAX_SHARED_READS buffers or costs more than MAX_SHARED_COST
    simple ops (ALU_COST);
  * everything else (elementwise chains, movement ops, cheap shared subexpressions) fuses into its consumer,
    up to a size: a kernel whose body would pass MAX_KERNEL_BODY nodes is cut by materializing an intermediate, since
    gcc's compile time grows faster than the source past it (a chain of 1,200 sin steps was 123 s of gcc in one kernel).

One rule changes the graph first: a long reduction into few outputs (the sum of a 16M-element tensor) is split in
two, partial results over chunks of about 4096 elements (a kernel of its own, whose many outputs threads share),
then their reduction. One accumulator for millions of additions is both slow (one thread) and wrong (an f32 sum
of ones stops growing at 2**24); chunks keep every partial sum short.

The rebuild is bottom-up (as UOp.wrap's), so a materialized node whose sources were themselves materialized is
rebuilt over their buffers first (substitute would wrap the original, unrewritten node). Kernels come out in
creation order, which is a topological order: a kernel is made only after the kernels of its sources. A materialized
node that is also an output, or whose elements an output is in the same row-major order (a parameter's gradient: its
reduction reshaped to the parameter's shape), is stored straight into the output's buffer: no copy kernel after it.

Each kernel also gets a canonical form: its BUFFERs renumbered 0..n-1 in toposort order and the output last.
Kernels with the same structure up to buffer numbering have the same canonical (hash-consed) UOps, so a
backend's kernel cache keyed on them compiles each structure once.

kernelize_cached does the same one level up: a training loop builds the same graph every step over new buffers, and
kernelizing it again costs more than running its small kernels, so the schedule is remembered by the graph's structure
(its BUFFERs numbered in order of appearance) and a later graph of that structure gets the same kernels over its own
buffers, with fresh temporaries. Its answer is a Schedule: the kernels, and a Plan, one object per remembered structure
that says which of the schedule's buffers each kernel takes, so that a runtime can run the schedule again as one
launch graph (uopc.runtime.run_schedule) instead of looking at each kernel.
"""
from __future__ import annotations
import functools, weakref
from collections import OrderedDict
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Callable, NamedTuple
from uopc.uop import UOp, Ops, ParamArg, ALU, MOVEMENT, buf, prod, users_of, _argkey, _rebuild_graph
from uopc.dtype import DType
from uopc.composite import pad
from uopc.evaluate import identity

MAX_SHARED_READS = 4
# The largest fused body, in nodes that become code (see _split_large_bodies), before kernelize cuts a kernel in two.
# Measured as gcc 12.2's CPU seconds per node (-O3 -march=native, the C backend's source, Opts as uopc.opt chooses
# them) on chains y = sin(y * 1.0001 + 0.5) over a (64, 64) tensor, 3 nodes a step: elementwise, flat at 16-22 ms from
# 80 to 2,705 nodes, then 34 ms at 3,605 (123 s for the one kernel); under a sum (unrolled 4 times), 28 ms at 306, 37-46
# ms from 606 to 1,206, 59 ms at 1,806. Multiply-adds alone: 0.30-0.39 ms from 1,005 to 6,005 nodes, 0.87 at 16,005.
# Below the knees, with room for the unrolling Opts may choose; the GPT training step's largest kernel is 89 nodes.
MAX_KERNEL_BODY = 1000
COSTLY = 6                 # ALU ops (a transcendental counts as COSTLY) that make a broadcast value worth storing
# a value shared by kernels is stored when recomputing it costs more than this many simple ops (ten transcendentals):
# an LSTM's cell state (two sigmoids and a tanh, 96) feeds the step's output and the next step's cell, and recomputed,
# each step would redo every earlier step's gates (its kernels grew from 2 to 9.5 us over 12 steps); a GELU (28) or a
# sigmoid (22) is still recomputed by the kernels that share it
MAX_SHARED_COST = 10 * COSTLY
# a sum of products this deep or deeper keeps a costly epilogue out of its kernel (see _staged). Its cost grows with the
# depth: 0.9 ns an output at 128 (the default GPT's GELU gradient: cheaper than a kernel of its own, 1.1 ns), 2.4 ns at 384
EPILOGUE_MIN_DEPTH = 256
# what recomputing each ALU op costs, in simple ops: a transcendental (a libm call, a polynomial, a divide) counts as COSTLY
ALU_COST: dict[Ops, int] = {
  Ops.ADD: 1, Ops.MUL: 1, Ops.MAX: 1, Ops.CMPLT: 1, Ops.CMPNE: 1, Ops.WHERE: 1, Ops.CAST: 1, Ops.MULACC: 1,
  Ops.FLOORDIV: 1, Ops.FLOORMOD: 1,
  Ops.EXP2: COSTLY, Ops.LOG2: COSTLY, Ops.SIN: COSTLY, Ops.SQRT: COSTLY, Ops.RECIP: COSTLY,
}

# ops that stay inside a kernel: a value made of these is recomputed wherever it is used
_LOCAL = ALU | MOVEMENT | {Ops.STACK, Ops.INDEX, Ops.GATHER, Ops.CONST}


class KernelizeError(Exception):
  """Outputs kernelize can't schedule (not a shaped graph, an output that isn't a BUFFER of the right size)."""


@dataclass(frozen=True)
class Kernel:
  """One kernel: the shaped value `root`, computed over the BUFFERs in `inputs`, stored row-major into `out`.
  `canonical_root`/`canonical_out` are the same kernel with buffers renumbered (inputs 0..n-1, output n)."""
  root: UOp
  out: UOp
  inputs: tuple[UOp, ...]
  canonical_root: UOp
  canonical_out: UOp

  @property
  def buffers(self) -> tuple[UOp, ...]:
    """The kernel's buffers in canonical slot order: inputs, then the output."""
    return self.inputs + (self.out,)


SPLIT_MIN = 1 << 16        # a reduction of this many elements or more per output...
SPLIT_MAX_OUTPUTS = 1024   # ...into at most this many outputs is split into chunks
CHUNK = 4096


@functools.lru_cache(maxsize=1024)
def _chunk(n: int) -> int:
  """The chunk a reduction of n elements is split into: the divisor of n nearest CHUNK within a factor of 4 when there
  is one (no padding), else CHUNK. (Cached: the same sizes come back every step.)"""
  for off in range(CHUNK * 3 + 1):
    for d in (CHUNK - off, CHUNK + off):
      if CHUNK // 4 <= d <= CHUNK * 4 and n % d == 0: return d
  return CHUNK


def _split_reduce(u: UOp) -> UOp:
  """REDUCE(x) over R elements as REDUCE(STAGE(partials over chunks)), or u itself when it is not long (see SPLIT_MIN)."""
  rop, n = u.arg
  x = u.src[0]
  keep = x.shape[:len(x.shape) - n]
  size = prod(x.shape[len(x.shape) - n:])
  if size < SPLIT_MIN or prod(keep) > SPLIT_MAX_OUTPUTS: return u
  c = _chunk(size)
  flat = x.reshape(keep + (size,))
  if extra := -size % c:   # pad with the reduction's identity: zeros for a sum, and a mask picks -inf (INT_MIN) for a max
    widths = tuple((0, 0) for _ in keep) + ((0, extra),)
    padded = pad(flat, widths)
    if identity(rop, u.dtype) != 0:
      inside = pad(UOp.const(True).reshape((1,) * len(flat.shape)).expand(flat.shape), widths)
      padded = inside.where(padded, UOp.const(identity(rop, u.dtype), u.dtype).reshape((1,) * len(widths)).expand(padded.shape))
    flat = padded
  partials = flat.reshape(keep + (flat.shape[-1] // c, c)).reduce(rop, 1)
  return UOp(Ops.STAGE, (partials,)).reduce(rop, 1)


def _split_long_reductions(roots: list[UOp]) -> list[UOp]:
  long = {u for u in UOp(Ops.SINK, tuple(roots)).toposort() if u.op is Ops.REDUCE and u.arg[1] > 0 and _split_reduce(u) is not u}
  return UOp.wrap(roots, long, _split_reduce) if long else roots


def _expands(u: UOp) -> bool:
  return u.op is Ops.EXPAND and any(a != b for a, b in zip(u.src[0].shape, u.shape))


def _sum_of_products(r: UOp) -> bool:
  return r.arg[0] is Ops.ADD and r.arg[1] > 0 and _movement_chain(r.src[0])[-1].op is Ops.MUL


def _gemm(r: UOp) -> bool:
  """A sum of products whose two operands are each broadcast along an axis (a GEMM, a convolution), not a dot product
  per row (a variance, a layernorm's gradient)."""
  return _sum_of_products(r) and all(any(_expands(x) for x in _movement_chain(s)) for s in _movement_chain(r.src[0])[-1].src)


def _regions(roots: list[UOp], cut: set[UOp]) -> list[set[UOp]]:
  """For each kernel root, the nodes computed inside its kernel: reachable without crossing a cut or a BUFFER."""
  out = []
  buffer = Ops.BUFFER
  for r in roots:
    seen, stack = {r}, [r]
    add, push, pop = seen.add, stack.append, stack.pop
    while stack:
      for s in pop().src:
        if s not in seen and s not in cut and s.op is not buffer: add(s); push(s)
    out.append(seen)
  return out


def _stored_form(u: UOp, live: set[UOp], keep_layout: bool = False, stop: set[UOp] | frozenset = frozenset()) -> UOp | None:
  """What to store when u must be materialized: never a view. Walk down from u through movement ops, STAGE marks and
  ops with a single non-constant source (a pad's STACK with zeros, a mask's WHERE, x*2) and keep the node with the
  fewest elements: an EXPAND of a (B, T, C) activation to (B, T, C, 4C) stores the activation, and its consumers read
  it through the view. Between nodes of equal size only movement ops are passed (store x, not flip(x); but exp(x), not
  x, or every consumer would recompute the exp). An explicit STAGE keeps the layout it was given (keep_layout): a
  permutation is stored permuted (a GEMM operand packed into panels), a padding padded (a convolution's input); only
  a broadcast (an EXPAND that grows an axis, in its chain of movement ops) is refused and stored as above.
  None when nothing needs storing: a BUFFER is read as it is, and a value made of constants alone is recomputed. The walk
  goes no further down than a node in `stop`."""
  if keep_layout and not any(_expands(x) for x in _movement_chain(u)): return u if u in live and u.op is not Ops.BUFFER else None
  best, cur, moves_only = u, u, True
  while cur not in stop:
    if cur.op in MOVEMENT or cur.op is Ops.STAGE: nxt = cur.src[0]
    elif cur.op in _LOCAL and cur.src:
      inputs = [s for s in cur.src if s in live]
      if len(inputs) != 1: break
      nxt, moves_only = inputs[0], False
    else: break
    cur = nxt
    if prod(cur.shape) < prod(best.shape) or (moves_only and prod(cur.shape) == prod(best.shape)): best, moves_only = cur, True
  return best if best in live and best.op is not Ops.BUFFER else None


def _unstaged(u: UOp) -> UOp:
  """The node under u's STAGE marks (u itself when it is no STAGE)."""
  while u.op is Ops.STAGE: u = u.src[0]
  return u


def _movement_chain(u: UOp) -> list[UOp]:
  """u and the movement ops under it, down to the first other node."""
  chain = [u]
  while chain[-1].op in MOVEMENT: chain.append(chain[-1].src[0])
  return chain


def _same_memory(u: UOp) -> UOp:
  """The node under u's RESHAPEs and PERMUTEs when they only rename its row-major elements (element i of u is element i
  of that node: reshapes, and permutations that a later one undoes or that move axes of size 1), else u itself. A
  parameter's gradient is its GEMM's or its reduction's output behind such a chain, so the output's buffer can be the
  one the reduction stores into. Followed as a strided view: each node's axes as (size, stride) over the base."""
  chain = [u]
  while chain[-1].op in (Ops.RESHAPE, Ops.PERMUTE): chain.append(chain[-1].src[0])
  base = chain[-1]
  if base is u: return u
  n = prod(base.shape)
  axes: list[tuple[int, int]] = []
  for size in reversed(base.shape):       # row-major strides of the base
    axes.insert(0, (size, prod(x for x, _ in axes)))
  for v in reversed(chain[:-1]):
    if v.op is Ops.PERMUTE: axes = [axes[i] for i in v.arg]
    else:
      runs = _runs(axes)
      axes, at = [], 0
      for size in v.shape:
        if size == 1:
          axes.append((1, 0))
          continue
        if at == len(runs) or runs[at][0] % size: return u       # splits across runs: not a view of row-major memory
        rest = runs[at][0] // size
        axes.append((size, runs[at][1] * rest))
        if rest == 1: at += 1
        else: runs[at] = (rest, runs[at][1])
  return base if _runs(axes) in ([(n, 1)], []) else u


def _runs(axes: list[tuple[int, int]]) -> list[tuple[int, int]]:
  """Strided axes (size, stride) without those of size 1, adjacent ones merged where they walk memory as one."""
  runs: list[tuple[int, int]] = []
  for size, stride in axes:
    if size == 1: continue
    if runs and runs[-1][1] == stride * size: runs[-1] = (runs[-1][0] * size, stride)
    else: runs.append((size, stride))
  return runs


def _staged(roots: list[UOp]) -> set[UOp]:
  """The nodes to materialize, by the rules of the module docstring, each in its stored form (never a view)."""
  nodes = UOp(Ops.SINK, tuple(roots)).toposort()
  live: set[UOp] = set()     # nodes that read memory or reduce; the rest are constants, recomputed wherever used
  for u in nodes:
    if u.op in (Ops.BUFFER, Ops.REDUCE) or any(s in live for s in u.src): live.add(u)
  def stored(us, keep_layout: bool = False) -> set[UOp]: return {f for u in us if (f := _stored_form(u, live, keep_layout)) is not None}
  staged = stored((u.src[0] for u in nodes if u.op is Ops.STAGE), keep_layout=True)
  users = users_of(nodes)
  # what recomputing a value costs: its ALU ops down to memory, reductions and what is stored (a transcendental counts
  # as several); and a REDUCE broadcast by an EXPAND: carry each value's kernel-local REDUCEs up the graph until an
  # EXPAND (or a STACK) meets them
  cost: dict[UOp, int] = {}
  joins: dict[UOp, bool] = {}           # a concatenation of values read from memory is computed in u's kernel
  padded: dict[UOp, bool] = {}
  carried: dict[UOp, frozenset] = {}
  covered: set[UOp] = set()             # reductions a broadcast's rule has stored (alone, or inside what it stored)
  direct: dict[UOp, frozenset] = {}     # the sums of products among them reached without a broadcast on the way
  empty: frozenset = frozenset()
  for u in nodes:
    if u.op in ALU: cost[u] = min(1000, ALU_COST[u.op] + sum(cost[s] for s in u.src))
    elif u.op in MOVEMENT or u.op in (Ops.STACK, Ops.INDEX, Ops.GATHER): cost[u] = min(1000, sum(cost[s] for s in u.src))
    else: cost[u] = 0
    # a pad is a STACK of a value and zeros (or a view of one); pads of values added join them (a concatenation, as the
    # gradient of a split is). Not a STACK of several values: a convolution's window is one, of shifted views of one
    # input, which its GEMM reads as it is (stored, its 9 copies cost a pass and the kernel its vectors: 6 -> 28 ms)
    padded[u] = (u.op is Ops.STACK and any(s in live for s in u.src)) or (u.op in MOVEMENT and padded[u.src[0]])
    joins[u] = u.op in _LOCAL and (any(joins[s] for s in u.src) or (u.op is Ops.ADD and all(padded[s] for s in u.src)))
    if u.op is Ops.REDUCE:
      carried[u] = frozenset((u,))
      direct[u] = carried[u] if _sum_of_products(u) else empty
      # a sum of products (a GEMM, a convolution) under another reduction (a loss's sum, a global average pool, a max
      # pool) is stored first: nested in the outer reduction's loops it kept neither its vectors nor its register tiles
      # (a ResNet's last convolution fused into its pooling ran at 1 GFLOP/s). What is stored is the value the outer
      # reduction reads (the convolution with its bias and ReLU; a residual stream, not the GEMM inside it, so that a
      # layernorm's kernels read one buffer). One broadcast into it (a GEMM feeding the next) is the EXPAND rule's, and
      # so is a value that also reads another reduction's broadcast (a softmax's sum of exp(scores - max)). Where the
      # reduction reads a value whose sums of products are each read elsewhere too (attention's e @ v: the output's rows
      # and, in the backward, the row sums of do * (e @ v)), those are stored and the value is made in the reduction's
      # kernel: storing the value too was a kernel more, a pass over its elements (8 us of attention's step at N = 512)
      if (d := direct.get(u.src[0])) and carried[u.src[0]] <= d:
        staged |= stored(d) if _read_elsewhere(u.src[0], d, users, roots) else stored([u.src[0]])
    elif u.op in _LOCAL:
      c = d = empty
      for s in u.src:
        if carried[s]: c = c | carried[s]
        if direct[s]: d = d | direct[s]
      if u.op in ALU and len(d) > 1 and len({r.src[0].shape[-1] for r in d}) > 1 and min(r.src[0].shape[-1] for r in d) <= 16:
        # two sums of products joined whose innermost axes differ, one a short window (a residual block's 3x3
        # convolution, 9 positions, plus its 1x1 downsampling one over 16 channels): all but the largest are stored
        # first; together, one kernel's loops can't unroll the window and neither keeps its tiles. (A transformer's
        # residual sums, long axes alike, stay fused)
        largest = max(d, key=lambda r: (prod(r.src[0].shape), r.src[0].shape))
        rest = {r for r in d if r is not largest}
        staged |= stored(rest)
        c, d = c - rest, d - rest
      if u.op in ALU and d:
        for s in u.src:
          # a deep GEMM times a costly function of another GEMM's full output (a GELU's gradient: the GEMM carrying the
          # gradient to it, times the GELU's derivative at the forward GEMM's output) is stored first, and the product
          # made in a kernel of its own: in the GEMM's epilogue it made the whole kernel 1.6x slower (nanoGPT's dy @ W.T
          # of 2048 x 384 x 1536: 12.5 -> 20.0 ms; the GELU's gradient alone 2.6 ms). Not a function of the GEMM itself
          # (a GELU of its output), of a reduction broadcast or of no reduction (an optimizer's step size), nor a dot
          # product per row (a layernorm's gradient, times its variance's rsqrt): those stay where they are
          if not any(_gemm(r) and prod(r.src[0].shape[-r.arg[1]:]) >= EPILOGUE_MIN_DEPTH for r in direct[s]): continue
          others = [t for t in u.src if t is not s]
          if all(carried[t] and carried[t] <= direct[t] and not carried[t] & direct[s] and all(_gemm(r) for r in carried[t]) for t in others) and \
              sum(cost[t] for t in others) >= COSTLY:
            staged |= stored([s])
            c, d = c - direct[s], d - direct[s]
      carried[u], direct[u] = c, (empty if _expands(u) else d)
      if u.op is Ops.GATHER and c:
        # a reduction under a gather's rows or indices is stored first, unless it is stored already (a broadcast on the
        # way stored it, or another rule: a log-softmax's max and sum, the logits' GEMM, and the log-probabilities a loss
        # picks are computed at the rows picked, not stored whole): read at a loaded index, its loops would run once per
        # row picked (per element of each row, for the indices' reduction), and no Opts could tile them
        staged |= stored(s for s in u.src if carried[s] - covered - staged)
        carried[u], direct[u] = empty, empty
      elif u.op is Ops.STACK and c:
        # a reduction that reaches a concatenation (a pad's zeros beside it, a window's shifted views of it) would run
        # under the choice of branch, once for each branch that reads it, in loops no Opts can vectorize: store it first
        staged |= stored(_movement_chain(s)[-1] for s in u.src if carried[s])
        carried[u], direct[u] = empty, empty
        cost[u] = min(1000, sum(cost[s] for s in u.src if not carried[s]))   # those branches are loads now
      elif _expands(u):
        # a costly value broadcast is computed once, not once per copy (a GELU's gradient feeding a weight gradient),
        # reductions inside it included (layernorm's rsqrt(var + eps) is one kernel with its variance); a cheap one
        # is recomputed per copy, but not the reductions under it
        if cost[u.src[0]] >= COSTLY and (f := stored([u.src[0]])): staged |= f
        # a concatenation broadcast (an attention's q, k and v gradients joined for the projection's two GEMMs) is
        # stored too: read in a GEMM's inner loop, each element chose its branch and index again for every product
        elif joins[u.src[0]] and prod(u.shape) >= 8 * prod(u.src[0].shape) and (f := stored([u.src[0]])): staged |= f | c
        # a reduction broadcast through a cheap epilogue of its own alone (a linear layer's bias: q = x @ Wq + b, read
        # by attention's scores) is stored with it, in the reduction's kernel: its readers load the value instead of
        # adding the bias again, once for each copy (the scores' GEMM broadcast q + b from a register, a slot of the
        # FMA units, for each of its 8 rows a step: 0.56 -> 0.40 ms)
        else: staged |= {f} if (f := _epilogue(c, users)) is not None else c
        covered |= c                    # (each branch computes them in a kernel of their own: stored, or inside what is)
    else: carried[u] = direct[u] = empty
  staged |= _split_large_bodies(nodes, staged, live)
  # shared values: a node used by several kernels is materialized if recomputing it is costly
  root_set = set(roots)
  # each kernel's region, by its root, and each shared node's local region: a round's new cuts change only the regions
  # that hold one of them, so only those are walked again (each round walked every region: a third of a cold GPT step's
  # kernelize)
  regions: dict[UOp, set[UOp]] = {}
  locals_: dict[UOp, set[UOp]] = {}
  new: set[UOp] = set()
  while True:
    for r in [r for r, reg in regions.items() if not new.isdisjoint(reg)] + [r for r in dict.fromkeys(roots) if r not in regions] + \
             [r for r in staged if r not in regions]:
      regions[r] = _regions([r], staged)[0]
    for u in [u for u, reg in locals_.items() if not new.isdisjoint(reg)]: del locals_[u]
    owners: dict[UOp, set[int]] = {}
    for k, r in enumerate(list(roots) + list(staged)):
      for u in regions[r]: owners.setdefault(u, set()).add(k)
    costly: dict[UOp, set[UOp]] = {}
    for u, ks in owners.items():
      if len(ks) < 2 or u in staged or u.op in (Ops.CONST, Ops.BUFFER, Ops.SINK): continue
      # sharing starts at the topmost shared node: one that is a kernel root, or has a user in fewer kernels
      if u not in root_set and all(owners.get(v, set()) >= ks for v in users.get(u, ()) if v in owners): continue
      if (local := locals_.get(u)) is None: local = locals_[u] = _regions([u], staged)[0]
      if (any(x.op is Ops.REDUCE or x.op is Ops.GATHER for x in local) or len(_reads(local)) > MAX_SHARED_READS
          or sum(ALU_COST.get(x.op, 0) for x in local) > MAX_SHARED_COST): costly[u] = local
    # the deepest first: once a shared scores matrix is stored, the exp of it that two kernels share is cheap again
    new = stored(u for u, local in costly.items() if not any(v in local for v in costly if v is not u)) - staged
    if not new: break
    staged |= new
  # an output that would be materialized is simply computed into its own buffer, unless something else reads it
  return {u for u in staged if u not in root_set or users.get(u)}


def _read_elsewhere(value: UOp, products: frozenset, users: dict[UOp, list[UOp]], roots: list[UOp]) -> bool:
  """Whether each of the sums of products `products` under `value` is an output or has a user outside the graph from
  `value` down to it (so it is stored whatever `value`'s kernel does)."""
  inside, stack = {value}, [value]
  while stack:
    for s in stack.pop().src:
      if s not in inside:
        inside.add(s)
        if s not in products: stack.append(s)
  return all(r in roots or any(v not in inside for v in users.get(r, ())) for r in products)


def _epilogue(carried: frozenset, users: dict[UOp, list[UOp]]) -> UOp | None:
  """The top of the one carried reduction's epilogue of its own: the last elementwise op up the chain of nodes that are
  each their source's only user, of the reduction's size (views, a bias added), before the value fans out or grows.
  Stored instead of the reduction, it costs the reduction's kernel only its epilogue and stores no more. None where no
  elementwise op lies there (the reduction is read as it is), where the reduction is an output too (the SINK is its
  other user: it is computed once, into its own buffer), or where several reductions are carried."""
  if len(carried) != 1: return None
  (r,) = carried
  cur, top, size = r, None, prod(r.shape)
  while len(above := set(users.get(cur, ()))) == 1:
    cur = above.pop()
    if (cur.op not in ALU and cur.op not in MOVEMENT) or prod(cur.shape) != size: break
    if cur.op in ALU: top = cur
  return top


def _is_code(u: UOp, live: set[UOp]) -> bool:
  """Does u become code in a kernel: an ALU op, a reduction, a view that indexes memory (not a BUFFER, a CONST or a view
  of constants, which render as a literal)."""
  return u.op not in (Ops.BUFFER, Ops.CONST) and (u.op not in MOVEMENT or u in live)


def _split_large_bodies(nodes: list[UOp], staged: set[UOp], live: set[UOp]) -> set[UOp]:
  """The nodes to materialize so that no kernel's body exceeds MAX_KERNEL_BODY nodes, given the cuts in `staged`. A
  node's body is the set of nodes of its kernel-local graph that become code (see _is_code), with each materialized
  value it reads standing for the view it is read through. In toposort order, a node whose body would pass the limit
  gets its largest sources materialized (their stored forms) until it fits: a chain of 3,000 ops becomes kernels of at
  most MAX_KERNEL_BODY nodes each.

  A body is its sources' bodies joined, kept until the node's last user is visited, and handed on to that user rather
  than copied when nothing else needs it: a chain costs O(1) per node, and a graph that reuses its values
  (y = y*y + y) a set union in C per node, not a walk down the graph in Python."""
  cut = set(staged)
  split: set[UOp] = set()
  bodies: dict[UOp, set[UOp]] = {}
  pending = {u: len(us) for u, us in users_of(nodes).items()}   # edges to users not yet visited

  def walk(u: UOp) -> set[UOp]:
    """u's body counted afresh, down to the cuts (after a cut, for the bodies that held the new cut's nodes)."""
    counted = {u} if _is_code(u, live) else set()
    seen, stack = {u}, [u]
    while stack:
      for s in stack.pop().src:
        if s in seen or s.op is Ops.BUFFER: continue
        seen.add(s)
        if s in cut: counted.add(s)
        else:
          if _is_code(s, live): counted.add(s)
          stack.append(s)
    return counted

  def join(u: UOp, srcs: list[UOp]) -> set[UOp]:
    parts = [{s} if s in cut else bodies[s] for s in srcs]
    # the largest source body is handed on when u is its last user and u's body can't need splitting (a split looks at
    # the sources' bodies again); else it is copied
    fits = sum(map(len, parts)) < MAX_KERNEL_BODY
    last = [p for s, p in zip(srcs, parts) if fits and s not in cut and pending[s] == u.src.count(s)]
    body = max(last, key=len) if last else set(max(parts, key=len, default=()))
    for p in parts:
      if p is not body: body |= p
    if _is_code(u, live): body.add(u)
    return body

  for u in nodes:
    if u.op in (Ops.BUFFER, Ops.SINK): continue   # a SINK of the outputs is no kernel: each output is one
    srcs = [s for s in dict.fromkeys(u.src) if s.op is not Ops.BUFFER]
    body = join(u, srcs)
    if len(body) > MAX_KERNEL_BODY:
      # what to store for each source, found without walking past the cuts (a chain's lies at the bottom of the chain);
      # none for a BUFFER's view or constants
      options = [f for f in dict.fromkeys(_stored_form(s, live, stop=cut) for s in srcs if s not in cut) if f is not None and f not in cut]
      # first the value the most sources compute (in y*y + y, y: storing y*y would leave y's body in the sum), then the
      # largest
      options.sort(key=lambda f: (sum(f in bodies[s] for s in srcs if s not in cut), len(bodies.get(f, ()))), reverse=True)
      for f in options:
        cut.add(f)
        split.add(f)
        for v, b in bodies.items():   # the bodies that computed f now read it
          if f in b and v is not f: bodies[v] = walk(v)
        body = join(u, srcs)
        if len(body) <= MAX_KERNEL_BODY: break
    bodies[u] = body
    for s in u.src:
      pending[s] -= 1
      if not pending[s]: bodies.pop(s, None)
  return split


def _reads(region: set[UOp]) -> set[UOp]:
  return {s for u in region for s in u.src if s.op is Ops.BUFFER} | {u for u in region if u.op is Ops.BUFFER}


def canonicalize(root: UOp, out: UOp) -> tuple[UOp, UOp, tuple[UOp, ...]]:
  """(root, out) with BUFFERs renumbered: inputs 0..n-1 in toposort order, the output n; and the inputs in that order."""
  inputs = tuple(u for u in root.toposort() if u.op is Ops.BUFFER)
  mapping = {b: UOp(Ops.BUFFER, (), ParamArg(i, b.dtype, b.shape)) for i, b in enumerate(inputs)}
  canon_out = UOp(Ops.BUFFER, (), ParamArg(len(inputs), out.dtype, out.shape))
  return root.substitute(mapping) if mapping else root, canon_out, inputs


def kernelize(outputs: list[tuple[UOp, UOp]], new_buffer: Callable[[int, DType], UOp] | None = None,
              rewrite: Callable[[list[UOp]], list[UOp]] | None = None) -> list[Kernel]:
  """The kernels that compute each output (a shaped root and the BUFFER to store it in), in an order that runs
  every kernel after the kernels it reads from. `new_buffer(n, dtype)` makes a temporary BUFFER (by default a
  fresh slot above every slot in the graph). `rewrite(roots) -> roots`, when given, changes the graph first in the way
  one machine wants it (uopc.opt.graph_rewrite(caps): a CPU packs GEMM operands into panels with STAGE marks); the
  graph as written is what every backend gets otherwise."""
  roots = []
  if not isinstance(outputs, (list, tuple)) or not all(isinstance(o, (list, tuple)) and len(o) == 2 for o in outputs):
    raise KernelizeError(f"kernelize takes a list of (shaped UOp, output BUFFER) pairs, got {type(outputs).__name__}")
  for root, out in outputs:
    if not isinstance(root, UOp) or not isinstance(out, UOp): raise KernelizeError("kernelize takes (shaped UOp, output BUFFER) pairs")
    if out.op is not Ops.BUFFER: raise KernelizeError(f"kernelize: an output must be a BUFFER, got {out.op!r}")
    if out.dtype is not root.dtype or out.shape[0] < prod(root.shape):
      raise KernelizeError(f"kernelize: output BUFFER {out.dtype}[{out.shape[0]}] can't hold a {root.dtype}{root.shape} value")
    roots.append(root)
  if rewrite is not None: roots = rewrite(roots)
  roots = _split_long_reductions(roots)
  outputs = [(r, out) for r, (_, out) in zip(roots, outputs)]
  if new_buffer is None:
    top = max((u.arg.slot for u in UOp(Ops.SINK, tuple(r for r, _ in outputs) + tuple(o for _, o in outputs)).toposort()
               if u.op is Ops.BUFFER), default=-1)
    counter = iter(range(top + 1, 1 << 30))
    new_buffer = lambda n, d: buf(next(counter), n, d)
  staged = _staged(roots)
  kernels: list[Kernel] = []
  # a materialized value that is also an output is computed straight into the output's buffer (no copy kernel after)
  # (or behind a chain of views that renames its elements in place: a gradient reshaped to its parameter's shape; or
  # under STAGE marks, which an output is anyway: x.T.contiguous() realized was a transpose into a temporary, then a copy)
  into = {_unstaged(_same_memory(root)): out for root, out in reversed(outputs) if out.shape[0] == max(1, prod(root.shape))}

  def materialize(old: UOp, u: UOp) -> UOp:
    # (old: the node in the graph as given, which `into` knows; u: the same over its sources' buffers)
    if u.op is Ops.STAGE: return u.src[0]           # a STAGE's value was materialized in its stored form below it
    if prod(u.shape) == 0: return u.const_like(0)   # nothing to store: every view of it is empty too
    out = into.pop(old, None) or new_buffer(max(1, prod(u.shape)), u.dtype)
    kernels.append(make_kernel(u, out))
    return out.reshape(u.shape) if u.shape != out.shape else out

  stages = {u for u in UOp(Ops.SINK, tuple(roots)).toposort() if u.op is Ops.STAGE}
  targets = staged | stages
  new_roots = _rebuild_graph(list(roots), lambda old, u: materialize(old, u) if old in targets else u)
  for root, (_, out) in zip(new_roots, outputs):
    if _same_memory(root) is not out: kernels.append(make_kernel(root, out))
  return kernels


def make_kernel(root: UOp, out: UOp, canonical: bool = True) -> Kernel:
  """The Kernel that stores shaped `root` row-major into BUFFER `out`, with its canonical form. With canonical=False the
  buffers keep their slots (inputs in slot order): a hand-written program compiles with the names its author gave."""
  if not isinstance(root, UOp) or not isinstance(out, UOp) or out.op is not Ops.BUFFER or out.dtype is not root.dtype \
     or out.shape[0] < prod(root.shape):
    raise KernelizeError(f"a kernel stores a shaped UOp into a BUFFER of its dtype and size, got {root!r:.80} into {out!r:.80}")
  if not canonical:
    inputs = tuple(sorted((u for u in root.toposort() if u.op is Ops.BUFFER), key=lambda b: b.arg.slot))
    if len({b.arg.slot for b in inputs + (out,)}) != len(inputs) + 1: raise KernelizeError("two BUFFERs of this kernel share a slot")
    return Kernel(root, out, inputs, root, out)
  canon_root, canon_out, inputs = canonicalize(root, out)
  return Kernel(root, out, inputs, canon_root, canon_out)


__all__ = ["kernelize", "make_kernel", "Kernel", "Schedule", "Plan", "KernelizeError", "canonicalize", "MAX_SHARED_READS", "MAX_KERNEL_BODY",
           "ALU_COST"]


# ---- the schedule cache -------------------------------------------------------------------------------------------

SCHEDULE_CACHE_SIZE = 256            # schedules remembered (least recently used first out)...
SCHEDULE_CACHE_NODES = 1_000_000     # ...and graph nodes in all their keys (a key holds a small tuple per node)
SCHEDULE_CACHE_MAX_NODES = 100_000   # a graph larger than this is kernelized afresh
_schedules: OrderedDict[tuple, tuple] = OrderedDict()   # key -> (temporaries, kernels, nodes in the key, Plan, table)
_schedule_nodes = 0


class _BufferRef(NamedTuple):
  """Where a remembered schedule finds a kernel's buffer in a later graph of the same structure: the graph's BUFFER, the
  output or the new temporary at `index` (in the order _structure, the outputs and new_buffer give them)."""
  kind: str                  # "graph", "output" or "temporary"
  index: int


class Plan:
  """What is the same for every schedule of one structure, for a runtime that runs such schedules again (uopc.runtime's
  run_schedule keeps a launch graph per plan): `slots`, the kernels' buffers as indices into a Schedule's `table` (each
  kernel's inputs, then its output), and `written_first`, the indices whose first use is a kernel's output (allocated
  when nothing holds them yet; every other entry must hold data); `aliased` when a kernel has one buffer twice (its
  output among its inputs: a runtime must refuse it, not launch it). A key by identity: one per remembered structure."""
  __slots__ = ("slots", "written_first", "refs", "aliased")

  def __init__(self, slots: tuple[tuple[int, ...], ...], written_first: frozenset[int], refs: tuple[_BufferRef, ...]):
    self.slots, self.written_first = slots, written_first
    self.refs = refs           # where each table entry is found in a later graph of this structure
    self.aliased = any(len(set(row)) != len(row) for row in slots)


class Schedule(Sequence):
  """kernelize_cached's kernels (a sequence of Kernel, in order), with `plan` (a Plan, the same object for every schedule
  of this structure) and `table` (this schedule's distinct BUFFERs, in the order the plan's slots index). A hit's kernels
  are made when first read: a runtime that runs the schedule through its plan reads only `table`, and a training step's
  230 Kernels and 111 temporaries' BUFFERs were a quarter of its Python in kernelize_cached. Until then a temporary has
  no BUFFER: its `table` entry is None and `temps` gives its (size, dtype) by table index, so a runtime makes it a
  Buffer for the run alone; reading the kernels names every temporary (and empties `temps`)."""
  __slots__ = ("plan", "table", "temps", "_kernels", "_make")

  def __init__(self, kernels: list[Kernel] | None, plan: Plan, table: list[UOp | None],
               temps: dict[int, tuple[int, DType]] | None = None, make: Callable[[], tuple[list[Kernel], list[UOp]]] | None = None):
    self._kernels, self.plan, self.table, self.temps, self._make = kernels, plan, table, temps or {}, make

  def kernels(self) -> list[Kernel]:
    """The kernels, made now if not yet (and with them the temporaries' BUFFERs, into `table`)."""
    if self._kernels is None:
      self._kernels, names = self._make()
      for i in self.temps: self.table[i] = names[i]
      self.temps, self._make = {}, None
    return self._kernels

  def __len__(self) -> int: return len(self.plan.slots)
  def __getitem__(self, i): return self.kernels()[i]
  def __iter__(self): return iter(self.kernels())
  def __eq__(self, other) -> bool: return self.kernels() == (other.kernels() if isinstance(other, Schedule) else other)
  __hash__ = None   # type: ignore[assignment]   (a list's)
  def __repr__(self) -> str: return f"Schedule({self.kernels()!r})"


def _plan(steps: tuple) -> Plan:
  """The Plan of remembered steps ((canonical root, canonical out, input refs, output ref) per kernel)."""
  index: dict[_BufferRef, int] = {}
  slots, written = [], set()
  for _, _, ins, out in steps:
    row = [index.setdefault(r, len(index)) for r in ins]
    if out not in index: written.add(len(index))
    row.append(index.setdefault(out, len(index)))
    slots.append(tuple(row))
  return Plan(tuple(slots), frozenset(written), tuple(index))


def _structure(roots: list[UOp], outs: list[UOp]) -> tuple[tuple, list[UOp], int] | None:
  """The graph of `roots` as a hashable key with its BUFFERs anonymous (by dtype and size, numbered in toposort order),
  the output BUFFERs' dtypes and sizes; the graph's BUFFERs in that order; and its size in nodes (a SINK of the roots
  counted, as the cache's bound counts them). None for a graph too large to key.

  One walk in UOp.toposort's order (sources first, left to right) writes the key flat: per node its op, then a
  BUFFER's dtype and shape, or any other node's arg, its number of sources and their numbers; then the roots' numbers.
  Read back from the start it gives the graph again, so two graphs have one key only when they are one structure. (A
  tuple per node, after a toposort of its own: attention's forward and backward, 100 nodes, 61 us a key made and looked
  up, now 52.)"""
  index: dict[UOp, int] = {}
  flat: list = []
  bufs: list[UOp] = []
  emit, number = flat.append, index.__getitem__
  buffer, raw = Ops.BUFFER, _RAW_ARG
  # the node, and whether its sources are done (then it is numbered) or it is still to expand (see UOp.toposort)
  nodes, done, seen = list(reversed(roots)), [False] * len(roots), set()
  push, pop, push_done, pop_done, mark = nodes.append, nodes.pop, done.append, done.pop, seen.add
  while nodes:
    u = pop()
    if pop_done():
      index[u] = len(index)
      if (op := u.op) is buffer:
        bufs.append(u)
        emit(buffer)
        emit(u.dtype)
        emit(u.shape)
      else:
        emit(op)
        emit(a if (a := u.arg) is None or op in raw else _argkey(a))
        emit(len(src := u.src))
        for s in src: emit(index[s])
      continue
    if u in seen: continue
    mark(u)
    push(u)
    push_done(True)
    for s in reversed(u.src):
      if s not in seen:
        push(s)
        push_done(False)
  if len(index) > SCHEDULE_CACHE_MAX_NODES: return None
  flat.extend(map(number, roots))
  return (tuple(flat), tuple((o.dtype, o.shape) for o in outs)), bufs, len(index) + 1


def _keyed(roots: list[UOp], outs: list[UOp]) -> tuple[tuple, list[UOp], int] | None:
  """_structure(roots, outs), remembered on the first root (a graph's structure never changes): a graph built again
  over the same tensors while it lives (the Tensor frontend holds the graph it realized last) is keyed once.
  The other roots and the BUFFERs are held weakly, so the memo keeps nothing alive that its root's graph doesn't (a
  root kept as a realized value's history would otherwise keep the other roots' inputs)."""
  first, shapes = roots[0], tuple((o.dtype, o.shape) for o in outs)
  if (memo := first.__dict__.get("_structure")) is not None:
    others, at, key, refs, size = memo
    if at == shapes and len(others) == len(roots) - 1 and all(r() is u for r, u in zip(others, roots[1:])):
      if key is None: return None                          # too large to key, as before
      if None not in (bufs := [r() for r in refs]): return key, bufs, size
  found = _structure(roots, outs)
  key, bufs, size = found or (None, (), 0)
  first.__dict__["_structure"] = (tuple(map(weakref.ref, roots[1:])), shapes, key, tuple(map(weakref.ref, bufs)), size)
  return found


# ops whose arg is its own key in _structure: the type checker lets only ints (and Ops, dtypes) into them, so no two
# args that compare equal mean different things (a PERMUTE by (True, False) is the one by (1, 0)); _argkey's walk of
# each shape was a third of keying a GPT step's 1,852 nodes
_RAW_ARG = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.SHRINK, Ops.REDUCE, Ops.CAST})


def kernelize_cached(outputs: list[tuple[UOp, UOp]], new_buffer: Callable[[int, DType], UOp],
                     rewrite: Callable[[list[UOp]], list[UOp]] | None = None) -> Sequence[Kernel]:
  """kernelize(outputs, new_buffer, rewrite), remembered by the structure of the graph and the rewrite (see the module
  docstring; `rewrite` is a hashable value, equal for the same rewrite: uopc.opt.graph_rewrite's). On a hit the Kernels
  are the remembered ones over this graph's BUFFERs, its outputs and new temporaries from new_buffer, made when the
  Schedule's kernels are first read (see Schedule); their `root` is the canonical root (the graph over this call's
  buffers is never built: past kernelize only its shape is read). The answer is a Schedule (with the structure's Plan)
  whenever the graph could be keyed, else kernelize's list."""
  if not isinstance(outputs, (list, tuple)) or not all(isinstance(o, (list, tuple)) and len(o) == 2 and isinstance(o[0], UOp)
                                                        and isinstance(o[1], UOp) for o in outputs):
    return kernelize(outputs, new_buffer, rewrite)   # which says what is wrong
  outs = [o for _, o in outputs]
  found = _keyed([r for r, _ in outputs], outs)
  if found is None: return kernelize(outputs, new_buffer, rewrite)
  structure, bufs, size = found
  key = (structure, rewrite)   # one graph is packed for the C backend and not for CUDA: two schedules
  if (plan := _schedules.get(key)) is not None:
    try: _schedules.move_to_end(key)
    except KeyError: pass   # evicted by another thread meanwhile: the plan in hand is still right
    temp_sizes, steps, _, launch_plan, table = plan
    known = bufs + outs
    def make() -> tuple[list[Kernel], list[UOp]]:
      # every buffer of this call in one list, the graph's, the outputs', the new temporaries', which the remembered
      # steps index (a training step's 232 kernels looked each one up by kind and index: a third of a hit's time)
      at = (known + [new_buffer(n, d) for n, d in temp_sizes]).__getitem__
      return [Kernel(croot, at(out), tuple(map(at, ins)), croot, cout) for croot, cout, ins, out in steps], list(map(at, table))
    n = len(known)
    return Schedule(None, launch_plan, [known[i] if i < n else None for i in table],
                    {k: temp_sizes[i - n] for k, i in enumerate(table) if i >= n}, make)
  kernels = kernelize(outputs, new_buffer, rewrite)
  where: dict[UOp, _BufferRef] = {b: _BufferRef("graph", i) for i, b in enumerate(bufs)}
  for i, o in enumerate(outs): where.setdefault(o, _BufferRef("output", i))
  temp_sizes: list[tuple[int, DType]] = []
  for k in kernels:
    for b in k.buffers:
      if b not in where:
        where[b] = _BufferRef("temporary", len(temp_sizes))
        temp_sizes.append((b.shape[0], b.dtype))
  global _schedule_nodes
  steps = tuple((k.canonical_root, k.canonical_out, tuple(where[b] for b in k.inputs), where[k.out]) for k in kernels)
  launch_plan = _plan(steps)
  if key not in _schedules:
    start = {"graph": 0, "output": len(bufs), "temporary": len(bufs) + len(outs)}
    flat = lambda r: start[r.kind] + r.index
    _schedules[key] = (tuple(temp_sizes), tuple((cr, co, tuple(map(flat, ins)), flat(out)) for cr, co, ins, out in steps),
                       size, launch_plan, tuple(map(flat, launch_plan.refs)))
    _schedule_nodes += size
  while _schedules and (len(_schedules) > SCHEDULE_CACHE_SIZE or _schedule_nodes > SCHEDULE_CACHE_NODES):
    _schedule_nodes -= _schedules.popitem(last=False)[1][2]
  # (a graph kernelized again by a thread that lost the race to store it gets a plan of its own: a plan is a key)
  found = {ref: b for b, ref in where.items()}
  return Schedule(kernels, launch_plan, [found[r] for r in launch_plan.refs])
