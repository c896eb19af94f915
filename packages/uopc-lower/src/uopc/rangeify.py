"""Rangeify: from shapes to loops.

A shaped graph says *what* each element is. Rangeify says *how to compute one element*: give every output
axis a RANGE, then ask each node "what is your value at index (i0, i1, ...)?" and push the index down:

    BUFFER    value[i]               -> LOAD(INDEX(buf, i))
    ALU       f(a, b)[idx]           -> f(a[idx], b[idx])
    RESHAPE   x.reshape(s)[idx]      -> x[unravel(ravel(idx, s), x.shape)]      (simplified on the spot)
    EXPAND    x.expand(s)[idx]       -> x[0 where x had size 1]
    PERMUTE   x.permute(p)[idx]      -> x[inv] with inv[p[k]] = idx[k]
    SHRINK    x.shrink(b)[idx]       -> x[idx + begin]
    STACK     stack(a, b)[i, *rest]  -> where(i < 1, a[rest], b[rest])
    INDEX     x.index(i)[idx]        -> x[i, *idx]
    REDUCE    sum over the last n    -> new RANGEs, an accumulator, a loop

After rangeify no op has a shape: everything is a scalar in some loop, and the symbolic simplifier cleans
up the index arithmetic (ravel . unravel == id). `lower(root, out)` wraps it into a program: output loops,
the value at their index, a STORE into BUFFER `out`, the loops closed, everything simplified. `Opts` say
how to map the loops onto the machine (unrolled register tiles, a THREAD axis, cache tiles, GPU axes); they
change which ranges exist and how an index is assembled from them, never the rules above.

The walk is iterative: rangeify of (node, index) needs its sources at other indices, and that is a
recursion as deep as the graph, so each rule is a generator that yields the (node, index) pairs it needs
and receives their values, driven by an explicit stack. The memo is keyed on (node, index): the same node at
two indices is two computations, and hash consing makes the index tuple an exact, cheap key.
"""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Generator
from uopc.uop import UOp, Ops, ParamArg, AxisType, ALU, sink, range_, prod
from uopc.dtype import DType
from uopc.symbolic import simplify
from uopc.evaluate import identity


class LowerError(Exception):
  """A shaped graph that can't be lowered to loops (an op with no index rule, a bad output buffer, bad Opts)."""


def ravel(idx: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
  """The row-major flat position of index idx in shape (Horner's rule)."""
  flat = UOp.const(0)
  for i, s in zip(idx, shape): flat = flat * s + i
  return flat


def unravel(flat: UOp, shape: tuple[int, ...]) -> tuple[UOp, ...]:
  """The index in shape of row-major flat position `flat`: coordinate k is (flat // stride_k) % size_k."""
  out, stride = [], 1
  for s in reversed(shape):
    out.append((flat // stride) % s if s != 1 else UOp.const(0))
    stride *= s
  return tuple(reversed(out))


@dataclass
class Opts:
  """How to map a kernel onto the machine. Chosen by uopc.opt, applied during rangeify."""
  upcast: dict[int, int] = field(default_factory=dict)   # output axis -> unroll factor (register tile)
  thread: int | None = None                              # output axis run in parallel (OpenMP)
  unroll: int = 1                                        # unroll factor of the innermost reduce axis
  tile: dict[int, int] = field(default_factory=dict)     # output axis -> cache block size (loop tiling)
  gpu: bool = False                                      # output axes become GLOBAL (blockIdx) ranges
  local: dict[int, int] = field(default_factory=dict)    # output axis -> threads per block on that axis (LOCAL)


@dataclass
class Ctx:
  """The state of one lowering: range and accumulator counters, the memos, the Opts."""
  next_range: int = 0
  next_alloc: int = 0
  memo: dict = field(default_factory=dict)
  reduce_ranges: dict = field(default_factory=dict)
  opts: Opts = field(default_factory=Opts)

  def rng(self, size: int, kind: AxisType = AxisType.LOOP) -> UOp:
    self.next_range += 1
    return range_(size, self.next_range - 1, kind)

  def alloc(self, d: DType, n: int = 1) -> UOp:
    self.next_alloc += 1
    return UOp(Ops.ALLOC, (), ParamArg(self.next_alloc - 1, d, (n,)))


def ranges_in(*us: UOp) -> list[UOp]:
  """The RANGEs the expressions mention (syntactically), in loop order."""
  return sorted({r for u in us for r in u.toposort() if r.op is Ops.RANGE}, key=lambda r: r.arg)


# ---- the rules: one generator per op, yielding the (node, index) values it needs ---------------------------------

Need = Generator[list[tuple[UOp, tuple[UOp, ...]]], list[UOp], UOp]

def _rule(u: UOp, idx: tuple[UOp, ...], ctx: Ctx) -> Need:
  op = u.op
  if op is Ops.CONST: return u
  if op is Ops.BUFFER: return u.index(idx[0]).load()
  if op is Ops.STAGE: return (yield [(u.src[0], idx)])[0]        # no kernelizer here: compute it inline
  if op in ALU: return u.replace(src=tuple((yield [(s, idx) for s in u.src])))
  if op is Ops.INDEX:
    iv = yield [(i, ()) for i in u.src[1:]]
    return (yield [(u.src[0], tuple(iv) + idx)])[0]
  if op is Ops.STACK:
    i, rest = idx[0], idx[1:]
    vals = yield [(s, rest) for s in u.src]
    r = vals[-1]
    for k in range(len(u.src) - 2, -1, -1): r = (i < k + 1).where(vals[k], r)
    return r
  if op is Ops.RESHAPE:
    # simplify now: ((i*N + j)//N) % N mentions j but *is* i. Dependence analysis (which loops a reduce must
    # sit in) and the memo both need the truth.
    return (yield [(u.src[0], tuple(simplify(i) for i in unravel(ravel(idx, u.shape), u.src[0].shape)))])[0]
  if op is Ops.EXPAND:
    return (yield [(u.src[0], tuple(UOp.const(0) if s == 1 and n != 1 else i for i, s, n in zip(idx, u.src[0].shape, u.shape)))])[0]
  if op is Ops.PERMUTE:
    inv: list[UOp] = [UOp.const(0)] * len(idx)
    for k, p in enumerate(u.arg): inv[p] = idx[k]
    return (yield [(u.src[0], tuple(inv))])[0]
  if op is Ops.SHRINK: return (yield [(u.src[0], tuple(i + b if b else i for i, (b, _) in zip(idx, u.arg)))])[0]
  if op is Ops.REDUCE: return (yield from _reduce(u, idx, ctx))
  raise LowerError(f"rangeify: no index rule for {op!r} (a shaped graph holds BUFFERs, CONSTs, ALU, movement ops, "
                   f"STACK, INDEX, REDUCE and STAGE)")


def _axis_parts(ctx: Ctx, size: int, factor: int, kind: AxisType) -> tuple[UOp, int]:
  """An axis of `size` as (outer RANGE or CONST 0, unroll factor): index = outer * factor + c."""
  if factor > 1 and size % factor == 0:
    return (ctx.rng(size // factor, kind) if size > factor else UOp.const(0)), factor
  return (ctx.rng(size, kind) if size > 1 else UOp.const(0)), 1


def _combos(parts: list[tuple[UOp, int]]) -> list[tuple[UOp, ...]]:
  """Every index tuple obtained by fixing the unrolled part of each axis to a constant.
  parts[k] = (base, f): the index of axis k is base * f + c for c in 0..f-1."""
  out: list[tuple[UOp, ...]] = [()]
  for b, f in parts:
    known0 = b.op is Ops.CONST and b.arg == 0
    out = [c + (UOp.const(k) if known0 else (b * f + k if f > 1 else b),) for c in out for k in range(f)]
  return out


def _reduce(u: UOp, idx: tuple[UOp, ...], ctx: Ctx) -> Need:
  rop, n = u.arg
  x = u.src[0]
  rshape = x.shape[len(x.shape) - n:]
  # unrolled copies of the same reduce (they differ only by constants in idx) share one loop
  rkey = (u, frozenset(ranges_in(*idx)))
  if (parts := ctx.reduce_ranges.get(rkey)) is None:
    parts = [_axis_parts(ctx, s, ctx.opts.unroll if k == n - 1 else 1, AxisType.REDUCE) for k, s in enumerate(rshape)]
    ctx.reduce_ranges[rkey] = parts
  real = [r for r, _ in parts if r.op is Ops.RANGE]
  vals = yield [(x, idx + c) for c in _combos(parts)]
  if 0 in rshape: vals = [UOp.const(identity(rop, u.dtype), u.dtype)]    # an empty reduction is its identity
  while len(vals) > 1:                                    # an unrolled reduce axis: a balanced tree
    vals = [UOp(rop, (vals[i], vals[i + 1])) if i + 1 < len(vals) else vals[i] for i in range(0, len(vals), 2)]
  if not real or 0 in rshape: return vals[0]
  acc = ctx.alloc(u.dtype)
  # the accumulator lives inside the loops the output index uses...
  acc0 = acc.after(*ranges_in(*idx))
  init = acc0.index(0).store(UOp.const(identity(rop, u.dtype), u.dtype))
  # ...is re-read every iteration of the reduce loops...
  accl = acc0.after(init, *real)
  upd = accl.index(0).store(UOp(rop, (accl.index(0).load(), vals[0])))
  # ...and is read once more after the loops end
  return acc0.after(upd.end(*real)).index(0).load()


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
      gen = frame[1] = _rule(node, at, ctx)
      send = None
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
  """Unrolled copies each END the same shared loop. Merge them into one END over a SINK."""
  while True:
    groups: dict[tuple, list[UOp]] = {}
    for u in root.toposort():
      if u.op is Ops.END: groups.setdefault(u.src[1:], []).append(u)
    dup = next((g for g in groups.values() if len(g) > 1), None)
    if dup is None: return root
    merged = UOp(Ops.END, (UOp(Ops.SINK, tuple(e.src[0] for e in dup)), *dup[0].src[1:]))
    root = root.substitute({e: merged for e in dup})


def _gpu_axis(ctx: Ctx, size: int, local: int, factor: int) -> tuple[UOp, int]:
  """size = blocks * local * factor: index = (gidx * local + lidx) * factor + c."""
  if size % (local * factor) != 0: raise LowerError(f"gpu axis of size {size} is not divisible by local {local} * upcast {factor}")
  g = ctx.rng(size // (local * factor), AxisType.GLOBAL) if size // (local * factor) > 1 else UOp.const(0)
  if local == 1: return g, factor
  return g * local + ctx.rng(local, AxisType.LOCAL), factor


def _check_lower_args(root: UOp, out: UOp, o: Opts):
  if not isinstance(root, UOp) or not isinstance(out, UOp): raise LowerError("lower takes a shaped UOp and an output BUFFER UOp")
  if out.op is not Ops.BUFFER: raise LowerError(f"lower: the output must be a BUFFER, got {out.op!r}")
  if out.dtype is not root.dtype: raise LowerError(f"lower: output BUFFER is {out.dtype}, the value is {root.dtype}")
  if out.shape[0] < prod(root.shape):
    raise LowerError(f"lower: output BUFFER has {out.shape[0]} elements, the value {root.shape} needs {prod(root.shape)}")
  for name, d in (("upcast", o.upcast), ("tile", o.tile), ("local", o.local)):
    for k, f in d.items():
      if not 0 <= k < len(root.shape) or f < 1: raise LowerError(f"Opts.{name}: bad entry {k}: {f} for shape {root.shape}")
  if o.thread is not None and not 0 <= o.thread < len(root.shape): raise LowerError(f"Opts.thread: no axis {o.thread} in shape {root.shape}")
  if o.unroll < 1: raise LowerError(f"Opts.unroll must be >= 1, got {o.unroll}")


def lower(root: UOp, out: UOp, ctx: Ctx | None = None) -> UOp:
  """Lower one shaped value into a SINK that stores it, element by element, into BUFFER `out` (row-major)."""
  ctx = ctx or Ctx()
  o = ctx.opts
  _check_lower_args(root, out, o)
  if prod(root.shape) == 0: return sink()                   # nothing to compute
  if o.gpu:
    # each output axis gets a GLOBAL range and (optionally) a LOCAL one; neither becomes a loop on a GPU
    plist = [_gpu_axis(ctx, s, o.local.get(k, 1), o.upcast.get(k, 1)) for k, s in enumerate(root.shape)]
  else:
    # the THREAD axis gets the lowest range index, so it is the outermost loop
    order = ([o.thread] if o.thread is not None else []) + [k for k in range(len(root.shape)) if k != o.thread]
    tiled = {k: t for k, t in o.tile.items() if 1 < t < root.shape[k] and root.shape[k] % t == 0 and t % o.upcast.get(k, 1) == 0}
    parts: dict[int, tuple[UOp, int]] = {}
    # tiled axes: first every block loop (outer), then the loops inside a block. A block of outputs reuses
    # the same rows of each operand, so they stay in cache while the block is computed
    outer = {k: ctx.rng(root.shape[k] // t, AxisType.THREAD if k == o.thread else AxisType.LOOP) for k, t in tiled.items()}
    for k in order:
      f = o.upcast.get(k, 1)
      if k in tiled:
        inner = tiled[k] // f
        parts[k] = (outer[k] * inner + ctx.rng(inner) if inner > 1 else outer[k], f)
      else:
        parts[k] = _axis_parts(ctx, root.shape[k], f, AxisType.THREAD if k == o.thread else AxisType.LOOP)
    plist = [parts[k] for k in range(len(root.shape))]
  stores = []
  for idx in _combos(plist):
    val = rangeify(root, idx, ctx)
    stores.append(out.index(ravel(idx, root.shape) if root.shape else UOp.const(0)).store(val))
  loops = ranges_in(*(b for b, _ in plist))
  body = stores[0] if len(stores) == 1 else UOp(Ops.SINK, tuple(stores))
  return simplify(merge_ends(sink(body.end(*loops))))


__all__ = ["ravel", "unravel", "identity", "Opts", "Ctx", "ranges_in", "rangeify", "lower", "merge_ends", "LowerError"]
