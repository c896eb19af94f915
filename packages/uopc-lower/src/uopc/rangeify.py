"""Rangeify: from shapes to loops.

A shaped graph says *what* each element is. Rangeify says *how to compute one element*: give every output
axis a RANGE, then ask each node "what is your value at index (i0, i1, ...)?" and push the index down:

    BUFFER    value[i]               -> LOAD(INDEX(buf, i))
    ALU       f(a, b)[idx]           -> f(a[idx], b[idx])
    RESHAPE   x.reshape(s)[idx]      -> x[unravel(ravel(idx, s), x.shape)]      (simplified on the spot)
    EXPAND    x.expand(s)[idx]       -> x[idx, with 0 on the axes that grew from size 1]
    PERMUTE   x.permute(p)[idx]      -> x[inv] with inv[p[k]] = idx[k]
    SHRINK    x.shrink(b)[idx]       -> x[idx + begin]
    STACK     stack(a, b)[k, *rest]  -> a[rest] if k < 1 else b[rest]       (a chain of WHEREs)
    INDEX     x.index(i)[idx]        -> x[i, *idx]
    REDUCE    x.reduce(op, n)[idx]   -> op over the last n axes: new loops around an accumulator

After rangeify no op has a shape: everything is a scalar in some loop, and the symbolic simplifier cleans
up the index arithmetic (ravel . unravel == id). `lower(root, out)` wraps it into a program: output loops,
the value at their index, a STORE into BUFFER `out`, the loops closed, everything simplified. `Opts` say
how to map the loops onto the machine (unrolled register tiles, a THREAD axis, cache tiles, GPU axes); they
change which ranges exist and how an index is assembled from them, never the rules above. The rules are one table
keyed by op, INDEX_RULES; the movement ops share one rule over their index maps, INDEX_MAPS (the table above).

What rangeify and uopc.gpulower both speak (Opts, Ctx, Walk, ravel, unravel) lives in uopc.lowering. With
Opts(gpu=True) the output axes become GLOBAL and LOCAL ranges here, and three kinds of reduction are gpulower's rules,
called from _reduce: a block's threads sharing a reduction (group), a GEMM staged in shared memory (stage) or run on
tensor cores (tc), found by gemm_pattern below.

The walk is iterative: rangeify of (node, index) needs its sources at other indices, and that is a
recursion as deep as the graph, so a rule is a generator that yields the (node, index) pairs it needs and
receives their values (or, needing none, returns the value at once), driven by an explicit stack. The memo is keyed on (node, index): the same node at
two indices is two computations, and hash consing makes the index tuple an exact, cheap key.
"""
from __future__ import annotations
import dataclasses, functools, operator, threading
from typing import Callable, Generator
from uopc.uop import UOp, Ops, AxisType, ALU, MOVEMENT, sink, prod, _rebuild_graph
from uopc.dtype import dtypes, I32_MAX
from uopc.symbolic import simplify, bounds
from uopc.evaluate import identity, SUM_CHUNK
from uopc.lowering import LowerError, Opts, Ctx, Gemm, GpuAxis, Walk, Chunks, ReduceLoops, ravel, unravel, ranges_in
from uopc.gpulower import staged_gemm, tc_gemm, tc_outputs, combine_group, check_gpu_opts


# ---- the rules: one per op, a generator yielding the (node, index) pairs whose values it needs ------------------------

Needs = Generator[list[tuple[UOp, tuple[UOp, ...]]], list[UOp], UOp]


def _alu(u: UOp, idx: tuple[UOp, ...], ctx: Ctx) -> Needs: return u.replace(src=tuple((yield [(s, idx) for s in u.src])))
def _stage(u: UOp, idx: tuple[UOp, ...], ctx: Ctx) -> Needs: return (yield [(u.src[0], idx)])[0]   # no kernelizer here: inline
def _moved(u: UOp, idx: tuple[UOp, ...], ctx: Ctx) -> Needs: return (yield [(u.src[0], INDEX_MAPS[u.op](u, idx))])[0]


def _index(u: UOp, idx: tuple[UOp, ...], ctx: Ctx) -> Needs:
  iv = yield [(i, ()) for i in u.src[1:]]
  return (yield [(u.src[0], tuple(iv) + idx)])[0]


def _gather(u: UOp, idx: tuple[UOp, ...], ctx: Ctx) -> Needs:
  """GATHER(x, i)[B, s, r] = x[B, i[B, s], r] (B: its arg's batch axes): the index is a value computed (loaded) at (B, s),
  clamped into x's axis so that every address stays provably inside memory (the caller refuses indices outside it:
  uopc.tensor checks them first). min(v, n - 1) is written -max(-v, 1 - n), which the bounds follow where a WHERE's two
  branches would not."""
  x, i = u.src
  b, k, n = u.arg, len(i.shape), x.shape[u.arg]
  v = (yield [(i, idx[:k])])[0]
  neg = UOp.const(-1)
  at = UOp(Ops.MAX, (UOp(Ops.MUL, (UOp(Ops.MAX, (UOp(Ops.MUL, (v, neg)), UOp.const(1 - n))), neg)), UOp.const(0)))
  return (yield [(x, idx[:b] + (at,) + idx[k:])])[0]


def _stack(u: UOp, idx: tuple[UOp, ...], ctx: Ctx) -> Needs:
  i, rest = idx[0], idx[1:]
  if ctx.opts.split: ctx.selectors.append(i)    # where Opts.split may cut the last loop (see _segments)
  vals = yield [(s, rest) for s in u.src]
  r = vals[-1]
  for k in range(len(u.src) - 2, -1, -1): r = (i < k + 1).where(vals[k], r)
  return r


def _permuted(u: UOp, idx: tuple[UOp, ...]) -> tuple[UOp, ...]:
  """Output axis k is source axis arg[k], so the source's index puts idx[k] at position arg[k]."""
  back = dict(zip(u.arg, idx))
  return tuple(back[a] for a in range(len(idx)))


def _reshaped(u: UOp, idx: tuple[UOp, ...]) -> tuple[UOp, ...]:
  """The source's index of a RESHAPE: the row-major position in the output, read back in the source's shape. Done per
  group of axes whose sizes multiply to the same on both sides (the finest such split), so that an axis the reshape
  keeps passes its index through, and only a merge or split does arithmetic: its unravel is simplified now (((i*N +
  j)//N) % N mentions j but *is* i, and which loops a reduce must sit in, and the memo, need the truth). Ravelling
  every axis into one position and simplifying each coordinate back out gave the same indices at many times the cost
  (a quarter of a cold GPT step's planning)."""
  old, new = u.src[0].shape, u.shape
  if 0 in old:   # an empty reshape: no index is ever evaluated, and the sizes give no groups
    return tuple(simplify(i) for i in unravel(ravel(idx, new), old))
  out: list[UOp] = []
  i = j = 0
  while i < len(old) or j < len(new):
    if j < len(new) and new[j] == 1: j += 1; continue                      # an axis of 1: its index is 0
    if i < len(old) and old[i] == 1: out.append(UOp.const(0)); i += 1; continue
    i2, j2, po, pn = i + 1, j + 1, old[i], new[j]
    while po != pn:
      if po < pn: po, i2 = po * old[i2], i2 + 1
      else: pn, j2 = pn * new[j2], j2 + 1
    if i2 - i == 1 and j2 - j == 1: out.append(idx[j])
    else: out += _regrouped(idx[j:j2], new[j:j2], old[i:i2])
    i, j = i2, j2
  return tuple(out)


# _regrouped's answers, the UNRAVELED most recent, keys and values held alive: an index of loop counters dies with the
# kernel that lowered it, and the node memo of simplify with it, while the next kernel of the same shapes (a GPT's two
# layers, each Adam update, every elementwise kernel of a (16, 64, 128) activation) asks for the very same unravel again
# (hash consing makes it the same key). Only index arithmetic is held: RANGEs, constants, and loaded indices of a
# kernel's canonical BUFFERs, which name a slot, not memory.
UNRAVELED = 4096
_regroup_memo: dict[tuple, tuple[UOp, ...]] = {}
_regroup_lock = threading.Lock()


def _regrouped(idx: tuple[UOp, ...], new: tuple[int, ...], old: tuple[int, ...]) -> tuple[UOp, ...]:
  """The indices into `old` of the element at index `idx` of `new` (one group of axes of equal product), simplified."""
  key = (idx, new, old)
  if (hit := _regroup_memo.get(key)) is not None: return hit
  if len(old) == 1 and (flat := _split_position(idx, new, old[0])) is not None: out = (flat,)
  else: out = tuple(simplify(c) for c in unravel(ravel(idx, new), old))
  with _regroup_lock:
    _regroup_memo[key] = out
    while len(_regroup_memo) > UNRAVELED: del _regroup_memo[next(iter(_regroup_memo))]
  return out


def _split_position(idx: tuple[UOp, ...], new: tuple[int, ...], n: int) -> UOp | None:
  """A split's source index (one axis of n split into `new`): the row-major position of idx, simplified, when its bounds
  show it within [0, n), as those of loop counters do; unravel's `(position // 1) % n` simplifies to the same, after
  simplify multiplied out the Horner form and proved the modulo idle (most of a cold GPT step's reshape indices)."""
  terms, stride = [], 1
  for i, size in zip(reversed(idx), reversed(new)):
    if not (i.op is Ops.CONST and i.arg == 0): terms.append(i if stride == 1 else i * stride)
    stride *= size
  flat = simplify(functools.reduce(operator.add, reversed(terms))) if terms else UOp.const(0)
  lo, hi = bounds(flat)
  return flat if 0 <= lo and hi < n else None


# a movement op's value at idx is its source's value at another index: the index maps of the table above
INDEX_MAPS: dict[Ops, Callable[[UOp, tuple[UOp, ...]], tuple[UOp, ...]]] = {
  Ops.RESHAPE: _reshaped,
  Ops.EXPAND: lambda u, idx: tuple(UOp.const(0) if s == 1 and n != 1 else i for i, s, n in zip(idx, u.src[0].shape, u.shape)),
  Ops.PERMUTE: _permuted,
  Ops.SHRINK: lambda u, idx: tuple(i + b if b else i for i, (b, _) in zip(idx, u.arg)),
}


def _axis_parts(ctx: Ctx, size: int, factor: int, kind: AxisType, width: int = 1, lane: UOp | None = None,
                inside: Callable[[], object] | None = None) -> Walk:
  """How an axis of `size` is walked (see Walk). check_opts has made sure factor * width divides the size. Loops nest in
  creation order, so the lanes made here go inside the axis's loop (a vector per iteration), and so do the loops that
  `inside` makes, between the two (Opts.inner's); a reduction makes its lanes before all of its loops and passes them in
  (see _reduce)."""
  factor = max(factor, 1)
  steps = size // (factor * width)
  base = ctx.rng(steps, kind) if steps > 1 else UOp.const(0)
  if inside is not None: inside()
  if width > 1 and lane is None: lane = ctx.rng(width, AxisType.UPCAST)
  return Walk(base, factor, lane, width)


def _inner_steps(ctx: Ctx, parts: dict[int, Walk], inner: dict[int, int]) -> list[UOp]:
  """Opts.inner's loops: for each axis k of `inner`, the loop over the steps within one of its blocks, added to parts[k]
  (whose base is the block's first step). Made inside the kernel's innermost loop (_axis_parts' `inside`), once per
  piece of a split loop: a gathered vector's cache lines then serve the block's steps before they leave the L1."""
  made = []
  for k, b in sorted(inner.items()):
    r = ctx.rng(b)
    parts[k] = parts[k]._replace(base=parts[k].base + r)
    made.append(r)
  return made


def _combos(parts: list[Walk]) -> list[tuple[UOp, ...]]:
  """Every index tuple the unrolled parts spell out: axis k takes (base*f + c)*width + lane for each copy c < f, and the
  tuples are all the combinations, in row-major order."""
  combos: list[tuple[UOp, ...]] = [()]
  for base, f, lane, width in parts:
    if base.op is Ops.CONST and base.arg == 0: choices = [UOp.const(c) for c in range(f)]
    elif f == 1: choices = [base]
    else: choices = [base * f + c for c in range(f)]
    if lane is not None: choices = [c * width + lane for c in choices]
    combos = [prefix + (c,) for prefix in combos for c in choices]
  return combos


def _tree(op: Ops, vals: list[UOp]) -> UOp:
  """vals combined with op pairwise, level by level: a balanced tree, so unrolled terms don't form one long chain."""
  while len(vals) > 1: vals = [UOp(op, tuple(vals[i:i + 2])) if i + 1 < len(vals) else vals[i] for i in range(0, len(vals), 2)]
  return vals[0]


def _accumulate(rop: Ops, acc: UOp, terms: list[UOp], fma: bool) -> UOp:
  """acc combined with the unrolled terms: with fma, each product of an f32 sum is one fused multiply-add onto the
  accumulator (a*b + acc, rounded once); otherwise the terms are summed as a balanced tree first."""
  if fma and rop is Ops.ADD and acc.dtype is dtypes.f32:
    for t in terms: acc = UOp(Ops.MULACC, (t.src[0], t.src[1], acc)) if t.op is Ops.MUL else acc + t
    return acc
  return UOp(rop, (acc, _tree(rop, terms)))


def _reduce(u: UOp, idx: tuple[UOp, ...], ctx: Ctx) -> Needs:
  rop, n = u.arg
  src = u.src[0]
  popped = src.shape[len(src.shape) - n:]
  o = ctx.opts
  if o.gpu and ctx.gpu.gemm is not None and u is ctx.gpu.gemm.reduce:
    return (yield from (tc_gemm if o.tc else staged_gemm)(u, idx, ctx))
  # the loops are shared by every request that uses the same output ranges: unrolled copies of one reduce (indices that
  # differ only by constants) accumulate in one loop, which is what a register tile is
  outer = ranges_in(*idx)
  key = (u, frozenset(outer))
  # a GPU block's threads share the reduction, unless it is evaluated inside one they already share (x @ x summed: the
  # inner sums run per thread, at the outer sum's elements of that thread); a nested one the threads can't divide (a
  # row's 65 logits inside a sum over rows, asked for outside the shared one's lanes) runs whole in each thread
  grouped = o.gpu and o.group > 1 and n > 0 and (ctx.gpu.group_lane is None or ctx.gpu.group_lane not in outer) and \
    popped[-1] % o.group == 0
  if grouped and ctx.gpu.group_lane is None: ctx.gpu.group_lane = ctx.rng(o.group, AxisType.LOCAL)
  if key not in ctx.reduce_ranges:
    if grouped:
      *rest, inner = popped
      steps = inner // o.group
      parts = [_axis_parts(ctx, size, 1, AxisType.REDUCE) for size in rest] + \
        [Walk(ctx.rng(steps, AxisType.REDUCE) if steps > 1 else UOp.const(0), 1, ctx.gpu.group_lane, o.group)]
    else:
      # a reduction evaluated inside another one's lanes (x @ x summed in one kernel: the product's sum runs for every
      # element of the outer sum) keeps a scalar loop: a value can't have the lanes of two vectors
      lanes = 1 if any(r.arg.kind is AxisType.UPCAST for r in outer) else o.reduce_vector
      # the lanes come first, so every loop of the reduction nests inside them: each lane's partial accumulator lives
      # across all of the loops and is combined once, at the end
      lane = ctx.rng(lanes, AxisType.UPCAST) if lanes > 1 else None
      parts = [_axis_parts(ctx, size, o.unroll if k == n - 1 else 1, AxisType.REDUCE, *((lanes, lane) if k == n - 1 else (1, None)))
               for k, size in enumerate(popped)]
    long_sum = ctx.chunk_sums and rop is Ops.ADD and u.dtype.is_float and 0 not in popped
    ctx.reduce_ranges[key] = ReduceLoops(parts, _chunk_loops(ctx, parts) if long_sum else None)
  parts, chunks = ctx.reduce_ranges[key]
  loops = [w.base for w in parts if w.base.op is Ops.RANGE]
  lane = parts[-1].lane if parts else None
  if chunks is not None: return (yield from _chunked_sum(u, idx, parts, chunks, outer, lane, grouped, ctx))
  terms = yield [(src, idx + c) for c in _combos(parts)]
  if 0 in popped: return UOp.const(identity(rop, u.dtype), u.dtype)     # a reduction over nothing is its identity
  # no loop left (every reduced element unrolled): still start from the identity, as the evaluator and NumPy do (a sum
  # of one -0.0 is +0.0)
  if not loops and lane is None: return UOp(rop, (UOp.const(identity(rop, u.dtype), u.dtype), _tree(rop, list(terms))))
  zero = UOp.const(identity(rop, u.dtype), u.dtype)
  # one accumulator per iteration of the loops the output index uses (and, with lanes, per lane)
  acc = ctx.alloc(u.dtype)
  here = acc.after(*outer, *([lane] if lane is not None else []))
  start = here.index(0).store(zero)
  inside = here.after(start, *loops)                    # in the reduce loops, once it has been initialized
  update = inside.index(0).store(_accumulate(rop, inside.index(0).load(), list(terms), o.fma))
  done = here.after(update.end(*loops))                 # read after the loops are done
  return _reduction_value(u, done, outer, lane, grouped, ctx)


def _reduction_value(u: UOp, done: UOp, outer: list[UOp], lane: UOp | None, grouped: bool, ctx: Ctx) -> UOp:
  """The value of a reduction once its accumulator `done` (one per lane, or per thread of a group) has every term:
  combined by the group's threads, or over the lanes, or read as it is."""
  if grouped:
    return combine_group(u, done.index(0).load(), outer, ctx)
  if lane is None: return done.index(0).load()
  # partial accumulators: each lane summed its own share of the axis; they are combined lane by lane, in order, into one
  rop = u.arg[0]
  total = ctx.alloc(u.dtype)
  total_here = total.after(*outer)
  total_start = total_here.index(0).store(UOp.const(identity(rop, u.dtype), u.dtype))
  total_in = total_here.after(total_start, lane)
  total_update = total_in.index(0).store(UOp(rop, (total_in.index(0).load(), done.index(0).load())))
  return total_here.after(total_update.end(lane)).index(0).load()


# a rule returns the value at once (a CONST, a BUFFER's load) or is a generator of what it needs (see rangeify)
INDEX_RULES: dict[Ops, Callable[[UOp, tuple[UOp, ...], Ctx], Needs | UOp]] = {
  Ops.CONST: lambda u, idx, ctx: u,
  Ops.BUFFER: lambda u, idx, ctx: u.index(idx[0]).load(),
  Ops.STAGE: _stage,
  **dict.fromkeys(ALU, _alu),
  Ops.INDEX: _index,
  Ops.GATHER: _gather,
  Ops.STACK: _stack,
  **dict.fromkeys(INDEX_MAPS, _moved),
  Ops.REDUCE: _reduce,
}


# ---- long float sums: partial sums over chunks --------------------------------------------------------------------------
# One f32 accumulator for millions of terms is wrong: a sum of ones stops growing at 2**24 (uopc run of a sum of 2**25
# ones printed 16777216). So when a float sum adds more than SUM_CHUNK times into one accumulator, it adds into a
# partial sum over at most SUM_CHUNK steps of its innermost loop (that loop is split into chunks when it is longer, its
# last steps a tail loop of their own), and the partials into the total, in order. Every road gets it: the plain loops,
# lanes and unrolled steps (each lane's accumulator), a GPU thread's share of a reduction. uopc.evaluate sums in the
# same order (SUM_CHUNK is its constant), so the evaluator stays the plain loops' oracle bit for bit.

def _chunk_loops(ctx: Ctx, parts: list[Walk]) -> Chunks | None:
  """How a float sum over the loops of `parts` accumulates in chunks, or None when it adds SUM_CHUNK times or fewer."""
  looped = [k for k, w in enumerate(parts) if w.base.op is Ops.RANGE]
  if prod(parts[k].base.src[0].arg for k in looped) <= SUM_CHUNK: return None
  at = looped[-1]
  w = parts[at]
  others = tuple(parts[k].base for k in looped[:-1])
  steps = w.base.src[0].arg
  if steps <= SUM_CHUNK: return Chunks(at, w, w.base, others)      # a partial per run of the innermost loop
  full, rest = divmod(steps, SUM_CHUNK)
  chunk = ctx.rng(full, AxisType.REDUCE) if full > 1 else None
  inner = ctx.rng(SUM_CHUNK, AxisType.REDUCE)
  tail_loop = ctx.rng(rest, AxisType.REDUCE) if rest > 1 else None
  walk = w._replace(base=chunk * SUM_CHUNK + inner if chunk is not None else inner)
  tail = w._replace(base=UOp.const(full * SUM_CHUNK) + (tail_loop if tail_loop is not None else 0)) if rest else None
  return Chunks(at, walk, inner, others, chunk, tail, tail_loop)


def _chunked_sum(u: UOp, idx: tuple[UOp, ...], parts: list[Walk], c: Chunks, outer: list[UOp], lane: UOp | None, grouped: bool,
                 ctx: Ctx) -> Needs:
  """A long float sum (see Chunks): partials over chunks added to the total, then the tail's terms."""
  src, fma, d = u.src[0], ctx.opts.fma, u.dtype
  terms = yield [(src, idx + t) for t in _combos(parts[:c.at] + [c.walk] + parts[c.at + 1:])]
  tail_terms = (yield [(src, idx + t) for t in _combos(parts[:c.at] + [c.tail] + parts[c.at + 1:])]) if c.tail is not None else None
  zero, per, chunk = UOp.const(0.0, d), [*outer, *([lane] if lane is not None else [])], [c.chunk] if c.chunk is not None else []
  acc, part = ctx.alloc(d), ctx.alloc(d)
  here = acc.after(*per)
  start = here.index(0).store(zero)
  part_here = part.after(*per, *c.others, *chunk)        # a fresh partial per chunk
  part_in = part_here.after(part_here.index(0).store(zero), c.inner)
  part_update = part_in.index(0).store(_accumulate(Ops.ADD, part_in.index(0).load(), list(terms), fma))
  partial = part_here.after(part_update.end(c.inner)).index(0).load()
  inside = here.after(start, *c.others, *chunk)
  added = inside.index(0).store(inside.index(0).load() + partial).end(*chunk)
  if c.tail is not None:
    tail_loop = [c.tail_loop] if c.tail_loop is not None else []
    tail_in = here.after(added, *tail_loop)
    added = tail_in.index(0).store(_accumulate(Ops.ADD, tail_in.index(0).load(), list(tail_terms), fma)).end(*tail_loop)
  return _reduction_value(u, here.after(added.end(*c.others)), outer, lane, grouped, ctx)

def rangeify(u: UOp, idx: tuple[UOp, ...], ctx: Ctx) -> UOp:
  """The scalar value of shaped node u at index idx (a tuple of i32 scalars, one per axis of u)."""
  memo = ctx.memo
  if (r := memo.get((u, idx))) is not None: return r
  # a frame is [key, generator, the needs it is waiting for]; its needs are answered from the memo
  stack: list[list] = [[(u, idx), None, None]]
  while stack:
    frame = stack[-1]
    key, gen, needs = frame
    if gen is None:
      if key in memo: stack.pop(); continue              # asked for twice before it was computed once
      node, at = key
      if len(at) != len(node.shape): raise LowerError(f"rangeify: {node.op!r}: {len(at)} indices for shape {node.shape}")
      if (rule := INDEX_RULES.get(node.op)) is None:
        raise LowerError(f"rangeify: no index rule for {node.op!r} (a shaped graph holds BUFFERs, CONSTs, ALU, movement ops, "
                         f"STACK, INDEX, GATHER, REDUCE and STAGE)")
      gen = rule(node, at, ctx)
      if type(gen) is UOp: memo[key] = gen; stack.pop(); continue    # a rule that needs nothing gives its value at once
      frame[1], send = gen, None
    else:
      missing = [n for n in needs if n not in memo]
      if missing:
        stack.extend([n, None, None] for n in reversed(dict.fromkeys(missing)))   # leftmost first, like recursion
        continue
      send = [memo[n] for n in needs]
    try:
      frame[2] = gen.send(send)
    except StopIteration as done:
      memo[key] = done.value
      stack.pop()
  return memo[(u, idx)]


def merge_ends(root: UOp) -> UOp:
  """One END per set of loops. Unrolled copies each close the same shared loop with an END of their own; those become a
  single END over a SINK of what they closed."""
  while True:
    ends = [u for u in root.toposort() if u.op is Ops.END]
    by_loops: dict[tuple, list[UOp]] = {}
    for e in ends: by_loops.setdefault(e.src[1:], []).append(e)
    same = [group for group in by_loops.values() if len(group) > 1]
    if not same: return root
    group = same[0]
    joined = UOp(Ops.SINK, tuple(e.src[0] for e in group)).end(*group[0].src[1:])
    root = root.substitute(dict.fromkeys(group, joined))


def _gpu_axis(ctx: Ctx, axis: int, size: int, local: int, factor: int) -> Walk:
  """A GPU axis: blocks of `local` threads, each computing `factor` elements: index = (block * local + thread) * factor + c.
  Records how the axis is walked in ctx.gpu.axes (a GpuAxis: its block's origin, block * local * factor, and the threads)."""
  if size % (local * factor) != 0: raise LowerError(f"gpu axis of size {size} is not divisible by local {local} * upcast {factor}")
  blocks = size // (local * factor)
  block = ctx.rng(blocks, AxisType.GLOBAL) if blocks > 1 else UOp.const(0)
  thread = ctx.rng(local, AxisType.LOCAL) if local > 1 else None
  ctx.gpu.axes[axis] = GpuAxis(block * (local * factor) if blocks > 1 else UOp.const(0), thread, local, factor)
  return Walk(block if thread is None else block * local + thread, factor)


def _check_lower_args(root: UOp, out: UOp, o: Opts):
  if not isinstance(root, UOp) or not isinstance(out, UOp): raise LowerError("lower takes a shaped UOp and an output BUFFER UOp")
  _check_index_limits(root)
  if out.op is not Ops.BUFFER: raise LowerError(f"lower: the output must be a BUFFER, got {out.op!r}")
  if out.dtype is not root.dtype: raise LowerError(f"lower: output BUFFER is {out.dtype}, the value is {root.dtype}")
  if out.shape[0] < prod(root.shape):
    raise LowerError(f"lower: output BUFFER has {out.shape[0]} elements, the value {root.shape} needs {prod(root.shape)}")
  if not isinstance(o, Opts): raise LowerError(f"lower: Ctx.opts must be an Opts, got {type(o).__name__}")
  check_opts(root, o)


def _check_index_limits(root: UOp) -> None:
  """Loop counters and flat positions are i32: refuse an axis longer than i32 reaches, and a RESHAPE whose flat position
  (ravel, then unravel) would pass it, here with the shape, rather than as a CONST that "does not fit" deep in rangeify.
  A view bigger than that which is never flattened (the (n, m, k) product of a GEMM) is fine: its index stays per axis."""
  for u in root.toposort():
    if any(s > I32_MAX for s in u.shape):
      raise LowerError(f"lower: {u.op!r} of shape {u.shape} has an axis longer than an i32 loop counter reaches ({I32_MAX})")
    if u.op is Ops.RESHAPE and prod(u.shape) > I32_MAX and (merged := _largest_group(u.src[0].shape, u.shape)) > I32_MAX:
      raise LowerError(f"lower: a RESHAPE {u.src[0].shape} -> {u.shape} regroups {merged} elements: its flat positions "
                       f"pass i32 ({I32_MAX}), which indices can't hold")


def _largest_group(old: tuple[int, ...], new: tuple[int, ...]) -> int:
  """The most elements of one group of axes a RESHAPE merges or splits (the groups _reshaped ravels and unravels, each
  on its own): the range of the flat positions it computes. An axis it keeps passes its index through (0: none)."""
  if 0 in old: return 0
  largest, i, j = 0, 0, 0
  old, new = [s for s in old if s != 1], [s for s in new if s != 1]
  while i < len(old):
    i2, j2, po, pn = i + 1, j + 1, old[i], new[j]
    while po != pn:
      if po < pn: po, i2 = po * old[i2], i2 + 1
      else: pn, j2 = pn * new[j2], j2 + 1
    if i2 - i > 1 or j2 - j > 1: largest = max(largest, po)
    i, j = i2, j2
  return largest


def check_opts(root: UOp, o: Opts) -> None:
  """Refuse Opts that don't fit the kernel computing `root`, naming the field and the kernel's shape. Every entry must
  change the program: an Opts that lower() would have to ignore in part is an error, never silently dropped."""
  shape = root.shape
  def refuse(field_name: str, why: str): raise LowerError(f"Opts.{field_name}: {why} (kernel shape {shape})")
  up = dict(o.upcast)
  for name, pairs in (("upcast", o.upcast), ("tile", o.tile), ("local", o.local), ("inner", o.inner)):
    for k, f in pairs:
      if not 0 <= k < len(shape): refuse(name, f"there is no axis {k}")
      if f < 1: refuse(name, f"axis {k}: {f} must be at least 1")
  for k, f in o.upcast:
    if shape[k] % f: refuse("upcast", f"{f} does not divide axis {k} of size {shape[k]}")
  if o.unroll < 1: refuse("unroll", f"must be at least 1, got {o.unroll}")
  reduces = [u for u in root.toposort() if u.op is Ops.REDUCE and u.arg[1] > 0]
  inner = {u.src[0].shape[-1] for u in reduces}
  if o.unroll > 1:
    if not inner: refuse("unroll", f"{o.unroll}, but the kernel has no reduction to unroll")
    if wrong := sorted(n for n in inner if n % o.unroll): refuse("unroll", f"{o.unroll} does not divide the reduced axis of size {wrong[0]}")
  if o.reduce_vector != 1:
    rv = o.reduce_vector
    if rv < 2 or rv & (rv - 1): refuse("reduce_vector", f"lanes must be a power of two, got {rv}")
    if not inner: refuse("reduce_vector", f"{rv}, but the kernel has no reduction")
    if wrong := sorted(n for n in inner if n % (rv * o.unroll)):
      refuse("reduce_vector", f"{rv} lanes * unroll {o.unroll} do not divide the reduced axis of size {wrong[0]}")
    if o.vector is not None: refuse("reduce_vector", "a kernel has one vector axis: an output axis (vector) or the reduction's, not both")
  if o.fma and not any(u.arg[0] is Ops.ADD and u.dtype is dtypes.f32 for u in reduces):
    refuse("fma", "the kernel has no f32 sum to fuse multiply-adds into")
  if o.vector is not None:
    k, w = o.vector
    if not 0 <= k < len(shape): refuse("vector", f"there is no axis {k}")
    if w < 2 or w & (w - 1): refuse("vector", f"lanes must be a power of two, got {w}")
    if shape[k] % (w * up.get(k, 1)): refuse("vector", f"{w} lanes * upcast {up.get(k, 1)} do not divide axis {k} of size {shape[k]}")
  # an option of the other machine (each field's metadata says whose it is) is refused, in the words of its metadata
  for f in dataclasses.fields(Opts):
    if f.metadata.get("machine") == ("cpu" if o.gpu else "gpu") and getattr(o, f.name) != f.default: refuse(f.name, f.metadata["elsewhere"])
  if o.gpu:
    check_gpu_opts(root, o, refuse, gemm_pattern(root) if o.stage or o.tc else None)
    return
  lanes = {o.vector[0]: o.vector[1]} if o.vector is not None else {}
  step = lambda k: up.get(k, 1) * lanes.get(k, 1)      # the elements of axis k one iteration of its loop computes
  for k, t in o.tile:
    if not 1 < t < shape[k] or shape[k] % t: refuse("tile", f"{t} must divide axis {k} of size {shape[k]} and lie strictly between 1 and it")
    if t % step(k): refuse("tile", f"{t} on axis {k} must hold whole register tiles of {step(k)} (upcast * vector lanes)")
  if o.thread is not None:
    k = o.thread
    if not 0 <= k < len(shape): refuse("thread", f"there is no axis {k}")
    if shape[k] // step(k) < 2: refuse("thread", f"axis {k} of size {shape[k]} (upcast * lanes {step(k)}) leaves no loop to split")
  for k, b in o.inner:
    if not 1 < b < shape[k] or shape[k] % b: refuse("inner", f"{b} must divide axis {k} of size {shape[k]} and lie strictly between 1 and it")
    if step(k) != 1: refuse("inner", f"axis {k} is upcast or the vector's: its steps are unrolled, not a loop to move inside the others")
    if k == o.thread or k in dict(o.tile): refuse("inner", f"axis {k} is the threads' loop or tiled")
    if not any(j > k and (j != o.thread or j in dict(o.tile)) for j in range(len(shape))):
      refuse("inner", f"axis {k} has no loop after it to go inside (the last axis, or only the threads' untiled after it)")
  if o.inner and any(u.op is Ops.REDUCE for u in root.toposort()):
    refuse("inner", "a kernel with a reduction keeps its loops (the blocks' steps would go inside the reduction's)")
  if o.split:
    nodes = root.toposort()
    if not any(u.op is Ops.STACK for u in nodes): refuse("split", "the kernel has no concatenation (STACK) to split its last loop at")
    if any(u.op is Ops.REDUCE for u in nodes): refuse("split", "a kernel with a reduction keeps its loops (each piece would copy it)")
    if o.thread == len(shape) - 1 or dict(o.tile).get(len(shape) - 1): refuse("split", "the last axis is the threads' loop or tiled")


def _output_parts(ctx: Ctx, shape: tuple[int, ...], skip: int | None = None) -> list[Walk]:
  """(base, factor) for each output axis, creating the output RANGEs in loop order (none for axis `skip`: its Walk is
  a placeholder, for a caller that walks it in pieces)."""
  o = ctx.opts
  up, tiles = dict(o.upcast), dict(o.tile)          # check_opts has made sure every entry fits the shape
  vaxis, lanes = o.vector if o.vector is not None else (None, 1)
  if o.gpu:
    local = dict(o.local)
    return [_gpu_axis(ctx, k, s, local.get(k, 1), up.get(k, 1)) for k, s in enumerate(shape)]
  kind = lambda k: AxisType.THREAD if k == o.thread else AxisType.LOOP
  # the loops over tiles come first (outermost), so a block of outputs reuses the same rows of each operand while they
  # are in cache; the THREAD axis goes before everything, as the loop OpenMP splits. When the THREAD axis is tiled, its
  # blocks are what OpenMP splits and the loop inside a block keeps the axis's own place among the others (a transposing
  # copy walks a block of 16 rows inside each column: every line it reads serves 16 rows before it moves on)
  first = [o.thread] if o.thread is not None and o.thread not in tiles else []
  # the blocks of axes before an untiled THREAD axis go outside its loop, those after it inside (a GEMM threaded over a
  # batch walks each column panel down its rows: see choose_opts)
  # (a tiled THREAD axis's blocks first: OpenMP splits the outermost loop, and a tile's loop outside it would make a
  # parallel region of every one of its iterations)
  order = sorted(tiles, key=lambda k: k != o.thread)
  blocks = {k: ctx.rng(shape[k] // tiles[k], kind(k)) for k in order if not first or k < o.thread}
  if first: thread_walk = _axis_parts(ctx, shape[o.thread], up.get(o.thread, 1), AxisType.THREAD, lanes if o.thread == vaxis else 1)
  blocks.update({k: ctx.rng(shape[k] // t, kind(k)) for k, t in tiles.items() if k not in blocks})
  axes = first + [k for k in range(len(shape)) if k not in first]
  inner = dict(o.inner)
  innermost = [k for k in axes if k not in inner][-1] if inner else None    # check_opts: every inner axis's loop is outside it
  parts: dict[int, Walk] = {}
  for k in axes:
    f, w = up.get(k, 1), (lanes if k == vaxis else 1)
    if k == skip: parts[k] = Walk(UOp.const(0), f, None, w); continue
    if first and k == o.thread: parts[k] = thread_walk; continue
    if k in inner:   # its blocks here, the steps within a block inside the innermost loop (_inner_steps)
      parts[k] = Walk(ctx.rng(shape[k] // inner[k]) * inner[k], 1, None, 1)
      continue
    inside = (lambda: _inner_steps(ctx, parts, inner)) if k == innermost and inner and skip is None else None
    if k not in tiles: parts[k] = _axis_parts(ctx, shape[k], f, kind(k), w, inside=inside); continue
    within = tiles[k] // (f * w)    # iterations inside one tile
    base = blocks[k] * within + ctx.rng(within) if within > 1 else blocks[k]
    if inside is not None: inside()
    parts[k] = Walk(base, f, ctx.rng(w, AxisType.UPCAST) if w > 1 else None, w)
  return [parts[k] for k in range(len(shape))]


# ---- the GEMM pattern: which kernels stage= and tc= apply to -------------------------------------------------------

def _peel(u: UOp) -> tuple[list[UOp], UOp]:
  """The movement ops on top of u (outermost first) and the node under them."""
  chain = []
  while u.op in MOVEMENT:
    chain.append(u)
    u = u.src[0]
  return chain, u


def _replay(chain: list[UOp], u: UOp) -> UOp:
  """The movement ops of `chain` applied to u, as they were applied to the node they came from (elementwise ops
  commute with movement: movement(x * y) is movement(x) * movement(y))."""
  for m in reversed(chain): u = m.replace(src=(u,))
  return u


def _axes_moved(node: UOp, n_out: int) -> set[int]:
  """The output axes (of the first n_out axes of node's shape) along which node's value can change: rangeify it at an
  index of fresh ranges and see which ones its scalar value still mentions."""
  ctx = Ctx()
  idx = tuple(ctx.rng(s) if s > 1 else UOp.const(0) for s in node.shape)
  mentioned = set(ranges_in(rangeify(node, idx, ctx)))
  return {k for k in range(n_out) if idx[k] in mentioned}


@functools.lru_cache(maxsize=512)
def gemm_form(root: UOp) -> UOp:
  """root with each RESHAPE or PERMUTE of a reduction's result moved under the reduction: the reduction of the same
  elements reshaped to the new shape followed by the reduced axes (row-major, so the same sums), or with the kept axes
  permuted. A linear layer on a batch of sequences sums over (B*T, out, in) and reshapes the (B*T, out) result to (B,
  T, out), or on to (B, heads, T, d); summed as (B, T, out, in), the sum is at the output's own index, which is what
  stage and tc lower (gemm_pattern finds the GEMM in it, and hands it over as Gemm.root)."""
  if not any(u.op in (Ops.RESHAPE, Ops.PERMUTE) and u.src[0].op is Ops.REDUCE for u in root.toposort()): return root
  def visit(old: UOp, new: UOp) -> UOp:
    if new.op not in (Ops.RESHAPE, Ops.PERMUTE) or new.src[0].op is not Ops.REDUCE: return new
    r = new.src[0]
    x, n = r.src[0], r.arg[1]
    kept = len(x.shape) - n
    moved = x.reshape(new.arg + x.shape[kept:]) if new.op is Ops.RESHAPE else x.permute(new.arg + tuple(range(kept, len(x.shape))))
    return moved.reduce(r.arg[0], n)
  return _rebuild_graph([root], visit)[0]


@functools.lru_cache(maxsize=512)
def gemm_pattern(root: UOp) -> Gemm | None:
  """The Gemm that kernel root computes, or None (see uopc.lowering.Gemm): what stage and tc lower, and what uopc.opt
  looks for to choose them. It is found in gemm_form(root), which is what they lower (Gemm.root)."""
  root = gemm_form(root)
  nodes = root.toposort()
  reduces = [u for u in nodes if u.op is Ops.REDUCE]
  if len(reduces) != 1: return None
  r = reduces[0]
  if r.arg != (Ops.ADD, 1) or r.dtype is not dtypes.f32: return None
  # root reaches the reduction through elementwise ops only, so the reduction is asked for at the output's own index
  reaches: dict[UOp, bool] = {}
  for u in nodes:
    reaches[u] = u is r or any(reaches[s] for s in u.src)
    if reaches[u] and u is not r and u.op not in ALU: return None
  chain, product = _peel(r.src[0])
  if product.op is not Ops.MUL: return None
  x, y = (_replay(chain, s) for s in product.src)
  n = len(r.shape)
  ax, ay = _axes_moved(x, n), _axes_moved(y, n)
  only_x, only_y = sorted(ax - ay), sorted(ay - ax)
  if not only_x or not only_y: return None
  x16 = y16 = None
  halves = []
  for s in product.src:
    c, base = _peel(s)
    halves.append(_replay(chain, _replay(c, base.src[0])) if base.op is Ops.CAST and base.src[0].dtype is dtypes.f16 else None)
  if all(h is not None for h in halves): x16, y16 = halves
  i, j = only_x[-1], only_y[-1]
  along = (copy_along_k(x16, i, n), copy_along_k(y16, j, n)) if x16 is not None else (None, None)
  runs = along if x16 is not None else (copy_along_k(x, i, n), copy_along_k(y, j, n))
  return Gemm(r, x, y, i, j, r.src[0].shape[-1], x16, y16, *along, *runs, root=root)


def copy_along_k(expr: UOp, axis: int, k_axis: int) -> bool | None:
  """How 16-byte copies can read `expr` (an f16 GEMM operand, see Gemm.x_along_k; for an f32 one, which way its memory
  runs, Gemm.x_runs_k, the 8-element alignment asked of it too): True when neighbouring k are
  neighbouring elements of its memory, False when neighbouring elements of output axis `axis` are, None when neither (a
  fused producer, a broadcast, a stride or an offset that breaks 16-byte alignment): rangeified at 8 neighbours of a
  multiple of 8 on the axis, it is 8 LOADs of one BUFFER at addresses a, a + 1, ..., a + 7, with a a multiple of 8."""
  c = Ctx()
  probe = [c.rng(n) if n > 1 else UOp.const(0) for n in expr.shape]
  for inner in (k_axis, axis):
    if expr.shape[inner] % 8: continue
    start = list(probe)
    start[inner] = c.rng(expr.shape[inner] // 8) * 8
    addrs = []
    for e in range(8):
      at = list(start)
      at[inner] = start[inner] + e
      v = rangeify(expr, tuple(at), c)
      if v.op is not Ops.LOAD or v.src[0].op is not Ops.INDEX or v.src[0].src[0].op is not Ops.BUFFER: return None
      addrs.append(v.src[0])
    base = simplify(addrs[0].src[1])
    if any(a.src[0] is not addrs[0].src[0] or simplify(a.src[1] - base) is not UOp.const(e) for e, a in enumerate(addrs)): continue
    if simplify(base % 8) is UOp.const(0): return inner == k_axis
  return None


def lower(root: UOp, out: UOp, ctx: Ctx | None = None) -> UOp:
  """Lower one shaped value into a SINK that stores it, element by element, into BUFFER `out` (row-major)."""
  ctx = ctx or Ctx()
  if not isinstance(ctx, Ctx): raise LowerError(f"lower: ctx must be a Ctx, got {type(ctx).__name__}")
  _check_lower_args(root, out, ctx.opts)
  if prod(root.shape) == 0: return sink()                   # nothing to compute
  o = ctx.opts
  if o.gpu and (o.stage or o.tc) and (g := gemm_pattern(root)) is not None: root, ctx.gpu.gemm = g.root, g
  start = (ctx.next_range, ctx.next_alloc)
  if o.gpu and o.tc: combos = tc_outputs(ctx, root.shape)
  else:
    parts = _output_parts(ctx, root.shape)
    combos = _combos(parts)
  ctx.gpu.outputs = combos
  body = _stores(root, out, combos, ctx)
  if o.split and (cuts := _segments(root, parts, ctx)) is not None:
    # again, with the last loop split where a concatenation changes branch: each piece reads one branch, at an index
    # with no div or mod left in it (a 3x3 convolution's padded input, 8 x 64 x 34 x 34: 0.91 -> 0.23 ms)
    ctx.next_range, ctx.next_alloc, ctx.memo, ctx.reduce_ranges = *start, {}, {}
    last = len(root.shape) - 1
    outer = _output_parts(ctx, root.shape, skip=last)
    f, w = parts[last].factor, parts[last].width
    pieces = []
    for begin, end in zip(cuts, cuts[1:]):
      r = ctx.rng(end - begin) if end - begin > 1 else None
      mine = dict(enumerate(outer[:last]))
      made = _inner_steps(ctx, mine, dict(o.inner))        # each piece its own loops of Opts.inner, inside its r
      lane = ctx.rng(w, AxisType.UPCAST) if w > 1 else None
      walk = Walk(UOp.const(begin) if r is None else (r + begin if begin else r), f, lane, w)
      piece = _stores(root, out, _combos([mine[k] for k in range(last)] + [walk]), ctx)
      pieces.append(piece.end(*[x for x in (r, *made, lane) if x is not None]))
    combos = _combos(outer[:last])
    body = UOp(Ops.SINK, tuple(pieces))
  shared_lane = [ctx.gpu.group_lane] if ctx.gpu.group_lane is not None else []
  program = sink(body.end(*ranges_in(*(i for idx in combos for i in idx), *shared_lane)))
  return simplify(merge_ends(program))


def _stores(root: UOp, out: UOp, combos: list[tuple[UOp, ...]], ctx: Ctx) -> UOp:
  """The stores of root's value at each output index of combos into `out` (contiguous, row-major)."""
  stores = []
  for idx in combos:
    address = ravel(idx, root.shape) if root.shape else UOp.const(0)
    stores.append(out.index(address).store(rangeify(root, idx, ctx)))
  return stores[0] if len(stores) == 1 else UOp(Ops.SINK, tuple(stores))


MAX_SEGMENTS = 8        # pieces a split loop may have (each is a copy of the kernel's body)
MAX_SPLIT_STEPS = 512   # steps of a loop whose selectors are evaluated at each step to find where to split it


def _segments(root: UOp, parts: list[Walk], ctx: Ctx) -> list[int] | None:
  """Opts.split: where to split the last output loop of an elementwise kernel, the steps at which some concatenation's
  branch index (a STACK's selector that depends on that loop alone) changes, as [0, ..., steps]; None when it has no
  such index, has more than MAX_SPLIT_STEPS steps or would give more than MAX_SEGMENTS pieces (check_opts has refused a
  kernel with no STACK, with a reduction, or whose last loop is the threads' or tiled). Each piece then computes one
  branch per concatenation, which simplify finds from the loop's bounds, at an index free of the div and mod that
  picked it."""
  r = parts[-1].base
  if r.op is not Ops.RANGE or not 1 < (steps := r.src[0].arg) <= MAX_SPLIT_STEPS: return None
  alone = [s for s in dict.fromkeys(ctx.selectors) if ranges_in(s) == [r]][:16]
  if not alone: return None
  cuts = [0]
  prev = None
  for step in range(steps):
    at = {r: UOp.const(step)}
    vals = tuple(simplify(s.substitute(at)) for s in alone)
    if any(v.op is not Ops.CONST for v in vals): return None
    if prev is not None and vals != prev: cuts.append(step)
    prev = vals
  cuts.append(steps)
  return cuts if 2 < len(cuts) <= MAX_SEGMENTS + 1 else None


