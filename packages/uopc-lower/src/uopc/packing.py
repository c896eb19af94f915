"""uopc.packing: GEMM operands packed into panels and deep GEMMs summed in chunks, a CPU's choices made on the graph
before kernelize.

    GemmPacking(panel, rows, l2_bytes)(roots)   kernelize's `rewrite` on a CPU (uopc.opt.graph_rewrite makes it from Caps)

A deep, narrow GEMM (K at least 16 times N, its B more than half an L2) is first summed in chunks of K whose B fits in
half the L2: partial GEMMs, stored, then their sum (_split_depth). A GEMM whose B operand its vector loads would read
badly (along its columns, or rows PACK_STRIDE elements apart or more in a B too big for the L2) gets B copied into
panels of `panel` columns first: B[..., k, j] stored as P[..., j // panel, k, j % panel], a STAGE and so a kernel of its
own, whose copy uopc.opt walks in blocks (_transposing_axis). An A read down
its columns over a long sum (a weight's gradient) is packed into panels of the register tile's rows the same way. The
decisions read the graph alone: the strides of each operand's view (_offset, _strides), its size and how many rows
reuse it. Only a backend whose Caps ask for it packs (uopc.opt.graph_rewrite): a GPU stages its own tiles, and its tensor
cores need the f16 operand a packed f32 copy would replace.
"""
from __future__ import annotations
from typing import Callable
from dataclasses import dataclass
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, MOVEMENT, prod
from uopc.composite import pad


PACK_STRIDE = 256          # a B operand whose rows are this many elements apart (1 KiB of f32) or more is packed
PACK_BIG = 1 << 18         # ...when it holds more than this many (1 MiB of f32: more than stays in a core's L2 cache)
PACK_MID = 1 << 17         # ...or this many or more (512 KiB) when PACK_MID_ROWS rows or more read it (see _pack)
PACK_MID_ROWS = 512
PACK_MIN_ROWS = 8          # ...when the GEMM has enough rows of A to reuse each packed panel
PACK_ROWS = 8              # an A read down its columns is packed into panels of up to this many rows (the register tile's)
PACK_MIN_DEPTH = 512       # ...when its rows are a cache line apart or more and the GEMM sums this many products or more
PACK_MIN_WORK = 1 << 20    # ...and enough multiply-adds to pay for a kernel of its own
# ...or this many where PACK_REUSE_ROWS rows or more reuse each panel. A B read along its columns (x @ w.T) and left
# unpacked is read as dot products along k, each output a horizontal sum of its vector: a decode step's projections
# (16 x 128 @ 128 x 384) spent as long in those sums as in their multiply-adds. Packed, the panels give the register
# tile its broadcast form. In-graph under uopc.jit (the weight's pack then runs once: it reads state alone), 8 GEMMs a
# call: 16 x 128 @ 128 x 384 24.4 -> 7.7 us each, 16 x 128 @ 128 x 128 10.1 -> 5.3, an MLP's backward 256 x 10 @ 10 x
# 256 68 -> 10; the pack run at every call (a weight passed as an argument), 24.8 -> 18.1, 10.9 -> 10.2, 69 -> 13.
# With 8 rows the pack at every call outweighed it (8 x 128 @ 128 x 384: 14.4 -> 15.9 us), and below 128K multiply-adds
# its kernel's launch does (a 64 x 16 attention's scores)
PACK_SMALL_WORK = 1 << 17
PACK_REUSE_ROWS = 16
PACK_NARROW = 16           # a B with fewer columns than this, rows contiguous, is copied transposed (see _pack) ...
PACK_NARROW_DEPTH = 64     # ... when each output sums this many products or more
# a GEMM of this many multiply-adds or more whose C is not a whole number of panels wide (and wider than one) is
# computed over B padded with zero columns to whole panels (_padded). Below it the two kernels more (the pad's
# copy, C's read back) cost what they save in a plain call: 256 x 128 @ 128 x 65, 2M, 137 against 141 us; 512 x 64 @
# 64 x 100, 3.3M, 236 -> 133 us; 1024 x 128 @ 128 x 65 302 -> 186 us
PAD_MIN_WORK = 1 << 21


def divisor_at_most(n: int, want: int) -> int:
  """The largest divisor of n that is at most `want` (a register tile's rows or vectors along an axis of n)."""
  return max(d for d in range(1, max(1, min(n, want)) + 1) if n % d == 0)


def _offset(view: UOp, idx: tuple[int, ...]) -> int | None:
  """Where element idx of `view`, a chain of movement ops, lies in the row-major layout of the node under the chain (a
  BUFFER, or the value kernelize will store: its stored form is its own row-major layout). Plain integer arithmetic,
  one op at a time (each op's index map, as in rangeify's table); None when the chain holds anything else."""
  u = view
  while u.op in MOVEMENT:
    src = u.src[0].shape
    if u.op is Ops.RESHAPE:
      flat = 0
      for i, n in zip(idx, u.shape): flat = flat * n + i
      out = []
      for n in reversed(src): out.append(flat % n if n else 0); flat //= max(n, 1)
      idx = tuple(reversed(out))
    elif u.op is Ops.EXPAND: idx = tuple(0 if s == 1 else i for i, s in zip(idx, src))
    elif u.op is Ops.PERMUTE:
      back = dict(zip(u.arg, idx))
      idx = tuple(back[a] for a in range(len(idx)))
    else: idx = tuple(i + b for i, (b, _) in zip(idx, u.arg))   # SHRINK
    u = u.src[0]
  if u is view or u.op in (Ops.STACK, Ops.INDEX, Ops.CONST): return None
  flat = 0
  for i, n in zip(idx, u.shape): flat = flat * n + i
  return flat


def _strides(view: UOp) -> tuple[int, int] | None:
  """(stride along the second-to-last axis, along the last axis) of a movement-op view (see _offset); None when unknown."""
  lead = (0,) * (len(view.shape) - 2)
  zero = _offset(view, lead + (0, 0))
  if zero is None: return None
  along_n = _offset(view, lead + (1, 0)) - zero if view.shape[-2] > 1 else 0
  along_k = _offset(view, lead + (0, 1)) - zero if view.shape[-1] > 1 else 0
  return along_n, along_k


def _gemm_product(u: UOp) -> UOp | None:
  """The product of a GEMM C[..., i, j] = sum_k A[..., i, k] * B[..., k, j]: u a REDUCE over k of a product (behind a
  PERMUTE, as autodiff makes a weight's gradient) of an operand broadcast along j and one broadcast along i; None else."""
  if u.op is not Ops.REDUCE or u.arg != (Ops.ADD, 1) or u.dtype is not dtypes.f32 or len(u.src[0].shape) < 3: return None
  if (product := _permuted_product(u.src[0])) is None: return None
  a, b = product.src
  along = lambda x, axis: x.op is Ops.EXPAND and x.src[0].shape[axis] == 1 and x.shape[axis] > 1
  return product if (along(a, -2) and along(b, -3)) or (along(b, -2) and along(a, -3)) else None


SPLIT_DEPTH_PER_COLUMN = 16   # a GEMM summing 16 times more products than it has columns, or more, ...


def _split_chunk(u: UOp, l2_bytes: int) -> int | None:
  """The chunk of K a deep, narrow GEMM is summed in (_split_depth): K at least SPLIT_DEPTH_PER_COLUMN times N, and the
  largest halving of K whose B (chunk x N, f32) fits in half the L2 when all of B doesn't; None for any other node."""
  if (product := _gemm_product(u)) is None: return None
  n, k = product.shape[-2:]
  if k < SPLIT_DEPTH_PER_COLUMN * n: return None
  chunk = k
  while chunk % 2 == 0 and 4 * chunk * n > l2_bytes // 2: chunk //= 2
  return chunk if chunk < k and 4 * chunk * n <= l2_bytes // 2 else None


def _split_depth(u: UOp, chunk: int) -> UOp:
  """A deep, narrow GEMM (x @ W.T through a wide output layer, dx = dlogits @ W of (1024, 8192) @ (8192, 128)) summed
  in chunks of K (_split_chunk): partial GEMMs over the chunks, stored (a kernel of its own, its chunks the threads'
  axis), then summed. Whole, every row tile of A streamed all of B from the L3 and each column tile read all of A again
  (103 GFLOP/s at that size); in chunks each thread streams its rows of A past a B chunk held in its L2 (333 GFLOP/s;
  PyTorch's 318). The sum's order changes (chunk by chunk), as a long sum's chunks do (uopc.rangeify)."""
  *batch, m, n, k = u.src[0].shape
  lead, b = tuple(range(len(batch))), len(batch)
  parts = u.src[0].reshape((*batch, m, n, k // chunk, chunk)).permute(lead + (b + 2, b, b + 1, b + 3))     # (*batch, chunks, m, n, chunk)
  partial = UOp(Ops.STAGE, (parts.reduce(Ops.ADD, 1),))
  return partial.permute(lead + (b + 1, b + 2, b)).reduce(Ops.ADD, 1)


def _pack(u: UOp, panel: int, rows: int, whole: Callable[[UOp], bool], transposed: bool = False, lanes: int = 0) -> UOp:
  """A GEMM C[..., i, j] = sum_k A[..., i, k] * B[..., k, j] (REDUCE of a product whose operands are broadcast along j
  and along i) whose B would be read badly is given B packed into panels of `panel` columns: B[..., k, j] is stored as
  P[..., j // panel, k, j % panel], so the kernel's vector loads of a row of a panel are contiguous and the panel it
  walks down is one contiguous block. Badly: along a column (x @ w.T, q @ k.T: B's columns are contiguous, not its
  rows), or with rows so far apart that a panel thrashes the caches (an NN GEMM of 2048; in a B too big for L2, rows
  1 KiB apart are: nanoGPT's 1152 x 384 weight in dx = dy @ W). Likewise an A read down its
  columns, a cache line or more apart, over PACK_MIN_DEPTH products or more (a weight's gradient dy.T @ x: A is dy
  transposed, summed over every token) is packed into panels of `rows` rows (GemmPacking.rows, the register tile's),
  A[..., i, k] stored as P[..., i // rows, k, i % rows]: the tile's rows for one k are then one contiguous run instead
  of a cache line each, thousands of lines apart. An operand that is a slice of a longer one along
  the packed axis (attention's blocks: the first e keys of k) packs the whole one instead where `whole(base)` says so
  (GemmPacking: when other GEMMs read slices of it too), and reads its panels of the slice from that one pack. Where
  the kernel will store C transposed (`transposed`: see _transposed_sums) its vector lanes go along i, so A's panels
  are `panel` rows wide, and B is read as an A is otherwise, the register tile's rows along j for each k: it is packed
  whenever its rows are PACK_STRIDE or more apart, over enough steps, into panels of `rows` columns, as an A is."""
  if (product := _gemm_product(u)) is None: return u
  *batch, m, n, k = product.shape
  operands = product.src
  along = lambda x, axis: x.op is Ops.EXPAND and x.src[0].shape[axis] == 1 and x.shape[axis] > 1
  if m < PACK_MIN_ROWS or k < 8 or prod(product.shape) < (PACK_SMALL_WORK if m >= PACK_REUSE_ROWS else PACK_MIN_WORK): return u
  b_at = 1 if along(operands[1], -3) else 0
  small = operands[b_at].src[0]                            # B: (..., 1, n, k) before the broadcast along i, read as B[k, j]
  lead = small.shape[:-3]
  b_strides = _strides(small.reshape(lead + (n, k)).permute(tuple(range(len(lead))) + (len(lead) + 1, len(lead))))   # B[k, j]'s
  # C's columns not a whole number of panels (a vocabulary of 65, 1000 classes): the GEMM is computed n_pad columns wide
  # over B padded with zero columns (packed: the pad is a copy anyway), stored, and read back n wide (_padded). Not a B
  # stored row by row whose columns are whole vectors (`lanes` of them: 48 or 1008 columns): its kernel has all its
  # lanes unpadded already (2048 x 384 @ 384 x 48: 0.32 ms, padded to 64 0.46)
  padded = not transposed and n > panel and n % panel != 0 and prod(product.shape) >= PAD_MIN_WORK and \
    not (b_strides is not None and b_strides[1] == 1 and n % max(1, lanes) == 0)
  # likewise C's rows, where the register tile's rows that divide them are a quarter of `rows` or fewer (997 rows took
  # tiles of 1 row: 107 GFLOP/s against 303 for 1000): A padded with zero rows and stored (in panels where it is read
  # down its columns, as below), 997 x 256 @ 256 x 1024 4.90 -> 2.07 ms. Not where the tile keeps more (999 and 1023
  # rows, tiles of 3: 237 GFLOP/s, padded 2.21 -> 2.04 and 2.27 -> 2.13 ms, less than A's and C's copies may cost)
  a0 = operands[1 - b_at].src[0]                           # A: (..., m, 1, k) before the broadcast along j, read as A[i, k]
  a_strides = _strides(a0.reshape(a0.shape[:-3] + (m, k)))
  tall = not transposed and m > rows and divisor_at_most(m, rows) <= rows // 4 and prod(product.shape) >= PAD_MIN_WORK
  if padded or tall:
    m, n = -(-m // rows) * rows if tall else m, -(-n // panel) * panel if padded else n
    product = _padded(product, b_at, m, n)
    operands = product.src
  new = list(operands)
  # (a padded operand is packed as it is: its pad's top SHRINK is no slice of an operand other GEMMs read, see _in_panels)
  if tall:
    a_cols = a_strides is not None and abs(a_strides[1]) >= 16 and k >= PACK_MIN_DEPTH
    new[1 - b_at] = _in_panels(operands[1 - b_at], m, rows, _never) if a_cols else UOp(Ops.STAGE, (operands[1 - b_at].src[0],)).expand(product.shape)
  if padded: new[b_at] = _in_panels(operands[b_at], n, panel, _never)
  elif n % panel == 0 and n != panel and b_strides:
    along_k, along_j = b_strides                           # B[k, j]: rows are k, columns j
    # rows PACK_STRIDE or more apart put a column panel's lines in a few of the L1's sets (2 KiB apart: 4 sets of 12
    # ways for a GEMM 512's 1024 lines), so every row tile reads the panel from L2 again; a copy pays for itself when
    # enough rows read the panels (the rows of every batch that shares this B). GEMM 512, 4 runs alternating:
    # 1.09-1.96 (median 1.25) -> 1.06-1.14 ms; 2048 x 384 @ 384 x 384 2.15-2.20 -> 2.05-2.08 ms, (8, 256, 384) @ (384,
    # 384) 2.29-2.32 -> 2.15-2.16; 384^3 (384 rows) lost to the copy, 0.44-0.46 -> 0.49 ms
    reuse = m * prod(t for t, s in zip(batch, small.shape[:-3]) if s == 1)
    # stored transposed, B is read as an A otherwise is, a run of the tile's rows a step of k, lines PACK_STRIDE or more
    # apart (attention's dv = p.T @ do, from autodiff as (do.T @ p).T: p's rows 2 KiB apart, 8 keys read a step down its
    # 512 queries: 218 us; packed, 36 + 136 us, in attention's forward and backward at N = 512). Its panels are the
    # tile's rows wide, as an A's: in panels of 32 each step read 32 bytes of a new 128-byte row (the pack 31 us, the
    # GEMM 155); in panels of 8 the tile's rows walk one contiguous run (37 + 122 us, timed inside the step's native
    # graph). Rows nearer are not packed (an MLP's w gradient x.T @ dh, x 1024 x 128: 513 us unpacked, 20 + 554 us packed)
    if along_j != 1 or (transposed and abs(along_k) >= PACK_STRIDE and k >= PACK_MIN_DEPTH) or \
       (abs(along_k) >= PACK_STRIDE and (n * k > PACK_BIG or (n * k >= PACK_MID and reuse >= PACK_MID_ROWS))):
      new[b_at] = _in_panels(operands[b_at], n, rows if transposed else panel, whole)
  elif n < PACK_NARROW and k >= PACK_NARROW_DEPTH and not transposed and b_strides and b_strides[1] == 1:
    # a B narrower than a vector, stored row by row (x @ W into 10 classes): no vector fits its row, so the kernel ran
    # scalar; copied column by column (panels of one column: B.T, k contiguous) it takes dot products along k (an MLP's
    # 256 x 256 @ 256 x 10 under UOPC_DEBUG: 37 -> 15 us a launch; a jitted call 44 -> 24 us, the copy run once)
    new[b_at] = _in_panels(operands[b_at], n, 1, whole)
  a_rows = panel if transposed else rows
  if not tall and m % a_rows == 0 and m != a_rows and (st := a_strides):
    if abs(st[1]) >= 16 and k >= PACK_MIN_DEPTH: new[1 - b_at] = _in_panels(operands[1 - b_at], m, a_rows, whole)   # a line per k
  if all(a is b for a, b in zip(new, operands)): return u
  out = u.replace(src=(product.replace(src=tuple(new)),))
  return UOp(Ops.STAGE, (out,)).shrink(tuple((0, d) for d in u.shape)) if padded or tall else out


def _never(base: UOp) -> bool: return False


def _padded(product: UOp, b_at: int, m: int, n: int) -> UOp:
  """A GEMM's product (MUL of A broadcast along j and B, operand `b_at`, broadcast along i) over m rows and n columns,
  A padded with zero rows to m and B with zero columns to n. Its sum is C's value in the
  first rows and columns and 0 in the others; _pack stores it (a STAGE: a kernel whose output axes are whole register
  tiles and panels, so its tiles and vectors fit) and reads C back through a SHRINK. Unpadded, a GEMM's columns took no
  vector lanes, or fewer than the machine has: 1024 x 128 @ 128 x 65 (a GPT's head over a vocabulary of 65) ran at 44-57
  GFLOP/s, 1024 x 768 @ 768 x 4097 at 34, where 4096 columns run at 300; and 997 rows took register tiles of one row
  (997^3: 3.7 GFLOP/s with its columns too, 239 padded)."""
  *lead, _, _, k = product.shape
  full = (*lead, m, n, k)
  a, b = product.src[1 - b_at].src[0], product.src[b_at].src[0]      # (..., m0, 1, k) and (..., 1, n0, k)
  if m != a.shape[-3]: a = pad(a, ((0, 0),) * (len(a.shape) - 3) + ((0, m - a.shape[-3]), (0, 0), (0, 0)))
  if n != b.shape[-2]: b = pad(b, ((0, 0),) * (len(b.shape) - 2) + ((0, n - b.shape[-2]), (0, 0)))
  pair = (a.expand(full), b.expand(full))
  return product.replace(src=pair if b_at else pair[::-1])


def _in_panels(x: UOp, count: int, rows: int, whole: Callable[[UOp], bool]) -> UOp:
  """x, a GEMM operand broadcast from (..., count, 1, k) or (..., 1, count, k), read through a copy stored in panels of
  `rows` of its count axis: P[..., c // rows, k, c % rows] (a STAGE, so a kernel of its own). Where x is a slice of a
  longer operand along that axis, at panel boundaries, and `whole` says so of the longer one's source, the longer one is
  packed and its panels of the slice read."""
  small = x.src[0]
  lead = small.shape[:-3]
  swap = tuple(range(len(lead))) + (len(lead), len(lead) + 2, len(lead) + 1)
  axis = len(small.shape) - (3 if small.shape[-2] == 1 else 2)
  stage = lambda v: UOp(Ops.STAGE, (v.reshape(lead + (v.shape[axis] // rows, rows, small.shape[-1])).permute(swap),))
  if (found := _unshrunk(small, axis)) is not None and found[1] % rows == 0 and found[0].shape[axis] % rows == 0 and whole(found[2]):
    longer, start, _ = found
    packed = stage(_fold(longer)).shrink(tuple((0, d) for d in lead) + ((start // rows, (start + count) // rows), (0, small.shape[-1]), (0, rows)))
  else: packed = stage(_fold(small))
  return packed.permute(swap).reshape(small.shape).expand(x.shape)


def _fold(view: UOp) -> UOp:
  """view with the PERMUTEs that follow each other in its top chain of RESHAPEs and PERMUTEs composed into one (none
  where they undo each other), and the RESHAPEs that follow each other into one: the same view, built one way, so that
  two GEMMs reading one operand through different chains pack it once (the longer view of v shrunk transposed,
  v.T[..., :e].T, is then v's own view, which the GEMM of the last attention block reads whole)."""
  chain, u = [], view
  while u.op in (Ops.RESHAPE, Ops.PERMUTE):
    chain.append(u)
    u = u.src[0]
  for op in reversed(chain):
    if op.op is Ops.RESHAPE:
      base = u.src[0] if u.op is Ops.RESHAPE else u
      u = base if base.shape == op.shape else base.reshape(op.shape)
    elif u.op is Ops.PERMUTE:
      p = tuple(u.arg[i] for i in op.arg)
      u = u.src[0] if p == tuple(range(len(p))) else u.src[0].permute(p)
    else: u = u.permute(op.arg)
  return u


def _unshrunk(view: UOp, axis: int) -> tuple[UOp, int, UOp] | None:
  """view as a slice of a longer view along `axis`: (the longer view, where the slice starts, the source of the SHRINK
  that cut it), when under view's PERMUTEs and RESHAPEs that only add or drop axes of 1 lies a SHRINK of that axis
  alone (attention's blocks read the first keys of k so: transposed, shrunk, transposed back); else None."""
  ops: list[tuple[UOp, int]] = []           # the ops above the SHRINK, top first, each with the axis in its output
  u, a = view, axis
  while u.op in (Ops.RESHAPE, Ops.PERMUTE):
    ops.append((u, a))
    if u.op is Ops.PERMUTE: a = u.arg[a]
    else:
      src = u.src[0].shape
      if [d for d in u.shape if d != 1] != [d for d in src if d != 1] or u.shape[a] == 1: return None
      a = [i for i, d in enumerate(src) if d != 1][sum(1 for d in u.shape[:a] if d != 1)]
    u = u.src[0]
  if u.op is not Ops.SHRINK or any(b != (0, d) for i, (b, d) in enumerate(zip(u.arg, u.src[0].shape)) if i != a): return None
  longer, n = u.src[0], u.src[0].shape[a]
  for op, at in reversed(ops):
    longer = longer.permute(op.arg) if op.op is Ops.PERMUTE else longer.reshape(op.shape[:at] + (n,) + op.shape[at + 1:])
  return longer, u.arg[a][0], u.src[0]


def _permuted_product(x: UOp) -> UOp | None:
  """x, a product of two broadcasts, as MUL(EXPAND, EXPAND) with any PERMUTE above it pushed below the broadcasts (a
  weight's gradient comes from autodiff as a permuted product: PERMUTE(MUL(EXPAND(dy), EXPAND(x))) summed over its
  last axis); None when x is no such product."""
  if x.op is Ops.MUL: return x
  if x.op is not Ops.PERMUTE or x.src[0].op is not Ops.MUL or any(s.op is not Ops.EXPAND for s in x.src[0].src): return None
  p = x.arg
  return UOp(Ops.MUL, tuple(s.src[0].permute(p).expand(tuple(s.shape[a] for a in p)) for s in x.src[0].src))


@dataclass(frozen=True)
class GemmPacking:
  """kernelize's `rewrite` for a CPU: a deep, narrow GEMM is first summed in chunks of K (_split_depth, sized by
  `l2_bytes`), then each GEMM whose B operand its vector loads would read badly gets B packed into panels of `panel`
  columns (_pack), a kernel of its own. A value (frozen, compared by its panel), so that
  kernelize_cached keeps one schedule per rewrite. An A read down its columns is packed into panels of `rows` rows: the
  register tile's (8 with 32 vector registers, 4 with 16: _register_tile)."""
  panel: int
  rows: int = PACK_ROWS
  l2_bytes: int = 0             # a deep, narrow GEMM is summed in chunks whose B fits in half of this (_split_depth); 0: never
  lanes: int = 0                # the machine's f32 vector lanes: a B stored by rows whose C is whole vectors wide is not padded
                                # (_pack); 0 (not known): no B stored by rows is

  def __call__(self, roots: list[UOp]) -> list[UOp]:
    # decided on the graph as it is; only the GEMMs that get split or packed are rebuilt (no graph rebuild when none is)
    nodes = UOp(Ops.SINK, tuple(roots)).toposort()
    if self.l2_bytes and (deep := {u for u in nodes if _split_chunk(u, self.l2_bytes) is not None}):
      # (the chunk asked again of the rebuilt node: its shapes are the original's)
      roots = UOp.wrap(roots, deep, lambda u: _split_depth(u, _split_chunk(u, self.l2_bytes)))
      nodes = UOp(Ops.SINK, tuple(roots)).toposort()
    transposed = _transposed_sums(nodes)
    # an operand sliced from a longer one that other GEMMs slice too (attention's blocks, each the first keys of k) is
    # packed whole, once, and each GEMM reads its panels of it: one pack of k a layer instead of one per block
    bases: dict[UOp, list[UOp]] = {}
    def note(u: UOp) -> Callable[[UOp], bool]:
      def seen(base: UOp) -> bool:
        bases.setdefault(u, []).append(base)
        return False
      return seen
    pack = lambda u, whole: _pack(u, self.panel, self.rows, whole, u in transposed, self.lanes)
    packed = [u for u in nodes if u.op is Ops.REDUCE and u.arg == (Ops.ADD, 1) and pack(u, note(u)) is not u]
    if not packed: return roots
    readers: dict[UOp, set[UOp]] = {}
    for u, bs in bases.items():
      for b in bs: readers.setdefault(b, set()).add(u)
    shared = {u for u, bs in bases.items() if all(len(readers[b]) > 1 for b in bs)}
    # UOp.wrap hands each packed GEMM over rebuilt (over packed operands below it), walking the same toposort as
    # `nodes`: the originals come in `packed`'s order, and whether C is stored transposed is decided on the original (its users)
    originals = iter(packed)
    def repack(u: UOp) -> UOp:
      orig = next(originals)
      assert u.arg == orig.arg and u.shape == orig.shape, "UOp.wrap visited the packed GEMMs out of the graph's order"
      return _pack(u, self.panel, self.rows, lambda base: orig in shared, orig in transposed, self.lanes)
    return UOp.wrap(roots, set(packed), repack)


def _transposed_sums(nodes: list[UOp]) -> set[UOp]:
  """The REDUCEs whose value is used (through RESHAPEs) only by a PERMUTE that moves its last axis: a GEMM C whose kernel
  stores C transposed (k's gradient in attention, ds.T @ q, comes from autodiff as (q.T @ ds).T). That kernel's last
  output axis, where choose_opts puts the vector lanes, is C's i: its A is then read along i, a vector at a time, and a
  panel of PACK_ROWS (8) rows would split each 16-lane vector in two runs (k's gradient: 111 GFLOP/s, 0.3 ms of
  attention's 1.1 ms forward and backward). Such an A is packed into panels of the B width instead."""
  users: dict[UOp, list[UOp]] = {}
  for u in nodes:
    for s in u.src: users.setdefault(s, []).append(u)
  out = set()
  for u in nodes:
    if u.op is not Ops.REDUCE or u.arg != (Ops.ADD, 1) or len(u.shape) < 2: continue
    v = u
    while (us := users.get(v, [])) and len(us) == 1 and us[0].op is Ops.RESHAPE and us[0].shape[-1:] == u.shape[-1:]: v = us[0]
    # then a chain of PERMUTEs, composed (two transposes are none)
    axes = list(range(len(v.shape)))
    while (us := users.get(v, [])) and len(us) == 1 and us[0].op is Ops.PERMUTE:
      v = us[0]
      axes = [axes[a] for a in v.arg]
    if v is not u and v.op is Ops.PERMUTE and axes and axes[-1] != len(axes) - 1: out.add(u)
  return out


__all__ = ["GemmPacking", "SPLIT_DEPTH_PER_COLUMN", "PACK_STRIDE", "PACK_BIG", "PACK_MID", "PACK_MID_ROWS", "PACK_MIN_ROWS", "PACK_ROWS",
           "PACK_MIN_DEPTH", "PACK_MIN_WORK", "PACK_SMALL_WORK", "PACK_REUSE_ROWS", "PACK_NARROW", "PACK_NARROW_DEPTH", "PAD_MIN_WORK",
           "divisor_at_most"]
