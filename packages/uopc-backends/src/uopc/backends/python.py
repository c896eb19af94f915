"""The PYTHON backend: a GPU emulated with NumPy, the oracle for GPU lowering where no GPU is present.

    UOPC_DEVICE=PYTHON python train.py        Tensor(x, device="PYTHON")        get_backend("PYTHON")

It has no renderer: `compile` keeps the linearized program, and a launch runs it the way uopc.interpret does (a RANGE
opens a loop, its END jumps back, statements run top to bottom), except that every statement runs for all the threads
of the launch at once: a value is a NumPy array with one entry per thread (or a scalar, when every thread agrees). The
launch grid follows the contract in uopc.backends: the GLOBAL ranges are the digits of the block number, the LOCAL
ranges the digits of the thread number within the block, first range most significant. Memory: a BUFFER is the
handle's array; an ALLOC is per thread (registers, made fresh each time it is reached) or, in AddrSpace.SHARED, per
block (one array for the whole launch, as a GPU's shared memory is); a BARRIER ends a phase for every thread. A vector
(uopc.vectorize's 16-byte moves) is a last axis of lanes; a vector LOAD or STORE moves its elements one by one.

Lockstep hides races: all threads finish a statement before any starts the next, so a program with a missing BARRIER
still computes the right answer here. So the emulator checks them. Between two BARRIERs, every element of shared
memory remembers which thread wrote it and which threads read it; a read of an element another thread wrote, or a
write of an element another thread read or wrote, raises RaceError naming the buffer, the element and both threads.

WMMA (tensor cores, mma.m16n8k16 with f16 inputs and f32 accumulators) is a warp-wide operation: each of a warp's 32
lanes holds a fragment (8 elements of A, 4 of B, 4 of C). The emulator gathers the warp's A (16x16), B (16x8) and C
(16x8) from the fragments, multiplies, and hands each lane its 4 elements of D. Its fragment table is written below
from the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type"), independently of the one the lowering
uses (uopc.gpulower), so that a mistake in either shows up as a wrong GEMM.

cp.async (ASYNC_COPY) reads its 16 bytes when it is issued and writes them into shared memory only when an ASYNC_WAIT
waits for its group (the copies a thread issued before an ASYNC_COMMIT): until then the elements are the copy's, and a
read or a write of one is a RaceError ("its group was not waited for"); once landed they are the issuing thread's
stores, so another thread reading them before a BARRIER is the usual race. A program that ends with copies in flight
is refused. LDMATRIX is warp-wide too: lane l points at row l % 8 of matrix l // 8, and each lane gets its two halves of
each matrix (of its transpose with trans), as the PTX ISA's ldmatrix figure draws them.

Shared-memory bank conflicts are counted, not refused: every LOAD, STORE, ASYNC_COPY and LDMATRIX of shared memory adds
to its BankCount in EmulatedProgram.bank_counts (warp-wide executions, the passes through the 32 banks they took, the
passes they would take without a conflict), from byte addresses in the block's shared memory as the renderer lays it
out (a 16-byte access is served a quarter-warp at a time, 8 bytes a half-warp, 4 or less the whole warp; lanes on one
4-byte word share a pass). A test asserts a kernel's counts (a swizzled layout has none).

Numbers follow the C backend's semantics: f32 rounds per operation, i32 wraps, MAX propagates NaN, integer division by
zero gives 0, a float cast to i32 out of range gives INT_MIN, and EXP2 is the same polynomial. MULACC (and each of the
polynomial's steps) is C's fmaf: computed in float64 and rounded once to f32, exactly (see _fma_f32).
"""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Callable
import numpy as np
from uopc.uop import UOp, Ops, AxisType, ALU
from uopc.dtype import AddrSpace, DType, dtypes
from uopc.interpret import loop_jumps
from uopc.opt import Caps
from uopc.backends import BackendError, LinearProgram, memory_name
from uopc.backends.c import EXP2_POLY, shared_layout


class RaceError(BackendError):
  """Two threads of a block touched one element of shared memory between two BARRIERs, and one of them wrote it."""


_NP = {dtypes.f32: np.float32, dtypes.i32: np.int32, dtypes.bool: np.bool_, dtypes.f16: np.float16}


def _np(d: DType):
  if d not in _NP: raise BackendError(f"the PYTHON backend has no {d} values")
  return _NP[d]


# ---- WMMA, m16n8k16: which lane holds which element (PTX ISA 9.7.14.5.8) -------------------------------------------
# For lane l: g = l >> 2 (its group of four), t = l & 3 (its place in the group).
def _lanes(n: int, where) -> np.ndarray:
  """(32, n, 2): the (row, column) `where(g, t, i)` gives for element i of lane l."""
  return np.array([[where(l >> 2, l & 3, i) for i in range(n)] for l in range(32)], np.int64)


def _a_elements() -> np.ndarray:
  """The (row, column) of A (16x16) that lane l holds as its element i (8 per lane)."""
  return _lanes(8, lambda g, t, i: (g if i in (0, 1, 4, 5) else g + 8, t * 2 + (i & 1) + (0 if i < 4 else 8)))


def _b_elements() -> np.ndarray:
  """The (row, column) of B (16x8) that lane l holds as its element i (4 per lane)."""
  return _lanes(4, lambda g, t, i: (t * 2 + (i & 1) + (0 if i < 2 else 8), g))


def _c_elements() -> np.ndarray:
  """The (row, column) of C and D (16x8) that lane l holds as its element i (4 per lane)."""
  return _lanes(4, lambda g, t, i: (g if i < 2 else g + 8, t * 2 + (i & 1)))


_A_AT, _B_AT, _C_AT = _a_elements(), _b_elements(), _c_elements()


def wmma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
  """D = A @ B + C for every warp: a (threads, 8) f16, b (threads, 4) f16, c (threads, 4) f32, threads a multiple of
  32 (consecutive threads are a warp's lanes) -> d (threads, 4) f32."""
  n = a.shape[0]
  if n % 32: raise BackendError(f"WMMA needs whole warps of 32 threads, the launch has {n}")
  warps = n // 32
  A = np.zeros((warps, 16, 16), np.float32)
  B = np.zeros((warps, 16, 8), np.float32)
  C = np.zeros((warps, 16, 8), np.float32)
  a, b, c = a.reshape(warps, 32, 8), b.reshape(warps, 32, 4), c.reshape(warps, 32, 4)
  A[:, _A_AT[..., 0], _A_AT[..., 1]] = a
  B[:, _B_AT[..., 0], _B_AT[..., 1]] = b
  C[:, _C_AT[..., 0], _C_AT[..., 1]] = c
  # the products of f16 values are exact in f32; the sums are rounded in f32 (the hardware's order is its own)
  D = (A.astype(np.float64) @ B.astype(np.float64) + C).astype(np.float32)
  return D[:, _C_AT[..., 0], _C_AT[..., 1]].reshape(n, 4)


# ---- scalar semantics, vectorized ------------------------------------------------------------------------------------

def _fma_f32(a, b, c) -> np.ndarray:
  """a*b + c rounded once to f32, elementwise, as C's fmaf: the product of two f32s is exact in a double, and the
  double sum, rounded to odd (the neighbour with an odd last bit, where it was inexact), rounds to f32 as the exact
  sum would (53 bits are more than 24 + 1)."""
  p = np.asarray(a, np.float32).astype(np.float64) * np.asarray(b, np.float32).astype(np.float64)
  c = np.asarray(c, np.float32).astype(np.float64)
  with np.errstate(invalid="ignore", over="ignore"):
    s = p + c
    bv = s - p
    err = (p - (s - bv)) + (c - bv)                           # the sum's rounding error, exactly (Knuth's two-sum)
    odd = np.isfinite(s) & (err != 0) & ((s.view(np.int64) & 1) == 0)
    s = np.where(odd, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def _exp2(x: np.ndarray) -> np.ndarray:
  """uopc_exp2 of the C backend, operation for operation in f32 (see EXP2_POLY in uopc.backends.c)."""
  f32 = np.float32
  x = np.asarray(x, f32)
  x = np.where(x < f32(-160), f32(-160), x)
  x = np.where(x > f32(160), f32(160), x)
  t = (x + f32(12582912.0)) - f32(12582912.0)
  f = x - t
  p = np.full_like(f, f32(EXP2_POLY[-1]))
  for coef in EXP2_POLY[-2::-1]: p = _fma_f32(p, f, f32(coef))
  n = np.where(t == t, t, f32(0)).astype(np.int32)
  a = n >> 1
  b = n - a
  sa = ((a + 127) << 23).astype(np.int32).view(np.float32)
  sb = ((b + 127) << 23).astype(np.int32).view(np.float32)
  return (p * sa) * sb


def _cast(x: np.ndarray, frm: DType, to: DType) -> np.ndarray:
  if to is dtypes.bool: return np.asarray(x != 0)
  if to is dtypes.i32 and frm.is_float:
    xf = np.asarray(x, np.float64)
    ok = (xf >= -2147483648.0) & (xf < 2147483648.0)        # NaN and out of range: INT_MIN, as the C backend
    return np.where(ok, np.trunc(np.where(ok, xf, 0)), -2147483648).astype(np.int32)
  return np.asarray(x).astype(_np(to))


def _wrap(x) -> np.ndarray:
  """int64 values wrapped to i32 (two's complement), as the C backend's i32 arithmetic."""
  return ((np.asarray(x, np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def _arith(int_op, float_op):
  """ADD or MUL: on i32 in int64, wrapped back to i32 (the C backend's wrapping arithmetic); on floats in their own type."""
  def apply(a: np.ndarray, b: np.ndarray, d: DType) -> np.ndarray:
    if d is dtypes.i32: return _wrap(int_op(a.astype(np.int64), b.astype(np.int64)))
    return float_op(a, b).astype(_np(d))
  return apply


def _floor(fn):
  """FLOORDIV or FLOORMOD of i32 values: floor semantics, and 0 for a zero divisor (NumPy's x // 0, as the C helpers)."""
  def apply(a: np.ndarray, b: np.ndarray, d: DType) -> np.ndarray:
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    return _wrap(np.where(b64 == 0, 0, fn(a64, np.where(b64 == 0, 1, b64))))
  return apply


# the ALU ops on NumPy arrays of every thread's values, one table per arity (CAST: _cast); f16 math is done in f32 and
# rounded to f16 (the result is cast to the op's dtype)
_UNARY = {Ops.RECIP: lambda x: np.float32(1) / x.astype(np.float32), Ops.EXP2: lambda x: _exp2(x.astype(np.float32)),
          Ops.LOG2: np.log2, Ops.SQRT: np.sqrt, Ops.SIN: np.sin}
_BINARY = {
  Ops.ADD: _arith(np.add, np.add), Ops.MUL: _arith(np.multiply, np.multiply),
  Ops.MAX: lambda a, b, d: np.where((a > b) | (a != a), a, b).astype(_np(d)),     # NaN wins, -0.0 vs 0.0 as the C code
  Ops.CMPLT: lambda a, b, d: a < b, Ops.CMPNE: lambda a, b, d: a != b,
  Ops.FLOORDIV: _floor(np.floor_divide), Ops.FLOORMOD: _floor(np.mod),
}
# on bools, as C's _Bool: + and max are "or", * is "and" (FLOORDIV and FLOORMOD take i32 only)
_BOOL = {Ops.ADD: lambda a, b: a | b, Ops.MUL: lambda a, b: a & b, Ops.MAX: lambda a, b: a | b, Ops.CMPLT: lambda a, b: ~a & b,
         Ops.CMPNE: lambda a, b: a != b}
_TERNARY = {
  Ops.WHERE: lambda c, a, b, d: np.where(c, a, b).astype(_np(d)),
  Ops.MULACC: lambda a, b, c, d: _fma_f32(a, b, c),
}


def _alu(u: UOp, vals: list) -> np.ndarray:
  # a vector's lanes are the last axis of its values: every op works lane by lane, on the lanes' dtype
  op, d = u.op, u.dtype.scalar()
  if op is Ops.CAST: return _cast(vals[0], u.src[0].dtype.scalar(), d)
  if len(vals) == 3: return _TERNARY[op](*vals, d)
  if len(vals) == 1: return np.asarray(_UNARY[op](np.asarray(vals[0]))).astype(_np(d))
  a, b = (np.asarray(v) for v in vals)
  return _BOOL[op](a, b) if u.src[0].dtype.scalar() is dtypes.bool else _BINARY[op](a, b, d)


# ---- memory ----------------------------------------------------------------------------------------------------------

class _Memory:
  """An ALLOC: per thread ((threads, n), rows by thread) or per block ((blocks, n)) for shared memory, with what has
  been written (a read before any write is an error) and, in shared memory, who wrote and read each element since
  the last BARRIER, and which thread's cp.async copy (ASYNC_COPY) is still on its way to it."""
  def __init__(self, u: UOp, threads: int, blocks: int, per_block: int, offset: int = 0):
    self.u, self.shared = u, u.addrspace is AddrSpace.SHARED
    n = u.arg.shape[0]
    rows = blocks if self.shared else threads
    self.data = np.zeros((rows, n), _np(u.dtype))
    self.written = np.zeros((rows, n), bool)
    self.per_block = per_block
    self.offset = offset                                  # bytes into the block's shared memory (the renderer's layout)
    if self.shared:
      self.writer = np.full((rows, n), -1, np.int64)
      self.reader = np.full((rows, n), -1, np.int64)      # -2: more than one thread read it
      self.pending = np.full((rows, n), -1, np.int64)     # the thread whose copy will write it, not yet waited for

  def name(self) -> str: return f"{memory_name(self.u)} (shared)" if self.shared else memory_name(self.u)

  def rows(self, tid: np.ndarray) -> np.ndarray: return tid // self.per_block if self.shared else tid

  def load(self, idx, tid: np.ndarray) -> np.ndarray:
    rows, cols = self.rows(tid), np.broadcast_to(idx, tid.shape)
    self._in_range(cols)
    if self.shared: self._not_pending(rows, cols, tid, "reads")
    if not self.written[rows, cols].all():
      k = int(np.argmin(self.written[rows, cols]))
      raise BackendError(f"{self.name()}: thread {tid[k]} reads element {cols[k]} before anything was stored in it")
    if self.shared:
      w = self.writer[rows, cols]
      bad = (w >= 0) & (w != tid)
      if bad.any():
        k = int(np.argmax(bad))
        raise RaceError(f"{self.name()}: thread {tid[k] % self.per_block} of block {rows[k]} reads element {cols[k]}, which thread "
                        f"{w[k] % self.per_block} wrote since the last BARRIER (a BARRIER is missing between them)")
      flat = rows * self.data.shape[1] + cols
      uniq, first, counts = np.unique(flat, return_index=True, return_counts=True)
      r = self.reader.reshape(-1)
      prev = r[uniq]
      mine = tid[first]
      r[uniq] = np.where((counts > 1) | ((prev != -1) & (prev != mine)), -2, mine)
    return self.data[rows, cols]

  def _not_pending(self, rows, cols, tid, what: str) -> None:
    p = self.pending[rows, cols]
    if (p >= 0).any():
      k = int(np.argmax(p >= 0))
      raise RaceError(f"{self.name()}: thread {tid[k] % self.per_block} of block {rows[k]} {what} element {cols[k]}, which a cp.async "
                      f"copy of thread {p[k] % self.per_block} is still writing (its group was not waited for: ASYNC_WAIT, then a BARRIER)")

  def _each(self, cols: np.ndarray, tid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, column, thread) of every element of cols (threads, n), thread tid[t] touching row t's n elements."""
    return np.repeat(self.rows(tid), cols.shape[1]), cols.reshape(-1), np.repeat(tid, cols.shape[1])

  def issue(self, cols: np.ndarray, tid: np.ndarray) -> None:
    """Thread tid[t] starts copies into elements cols[t] (an ASYNC_COPY): until they land (complete), nobody may touch them,
    and nobody may have read or written them since the last BARRIER (the copy may land at once)."""
    rows, cols, t = self._each(cols, tid)
    self._in_range(cols)
    self._not_pending(rows, cols, t, "starts a copy into")
    self._check_write(rows, cols, t)
    self.pending[rows, cols] = t

  def complete(self, cols: np.ndarray, values: np.ndarray, tid: np.ndarray) -> None:
    """The copies of thread tid[t] into elements cols[t] land (an ASYNC_WAIT waited for their group): they are its stores."""
    rows, cols, t = self._each(cols, tid)
    self.pending[rows, cols] = -1
    self.writer[rows, cols] = t
    self.data[rows, cols] = values.reshape(-1)
    self.written[rows, cols] = True

  def store(self, idx, value, tid: np.ndarray) -> None:
    rows, cols = self.rows(tid), np.broadcast_to(idx, tid.shape)
    self._in_range(cols)
    value = np.broadcast_to(np.asarray(value), tid.shape)
    if self.shared:
      self._not_pending(rows, cols, tid, "writes")
      flat = rows * self.data.shape[1] + cols
      uniq, first, counts = np.unique(flat, return_index=True, return_counts=True)
      if (counts > 1).any():
        k = int(np.argmax(counts > 1))
        others = tid[flat == uniq[k]] % self.per_block
        raise RaceError(f"{self.name()}: threads {others[0]} and {others[1]} of block {uniq[k] // self.data.shape[1]} both write "
                        f"element {uniq[k] % self.data.shape[1]} in one step")
      self._check_write(rows, cols, tid)
      self.writer[rows, cols] = tid
    self.data[rows, cols] = value
    self.written[rows, cols] = True

  def _check_write(self, rows, cols, tid) -> None:
    w, r = self.writer[rows, cols], self.reader[rows, cols]
    bad_w = (w >= 0) & (w != tid)
    bad_r = (r == -2) | ((r >= 0) & (r != tid))
    if bad_w.any() or bad_r.any():
      k = int(np.argmax(bad_w | bad_r))
      what = "wrote" if bad_w[k] else "read"
      other = f"thread {w[k] % self.per_block}" if bad_w[k] else ("other threads" if r[k] == -2 else f"thread {r[k] % self.per_block}")
      raise RaceError(f"{self.name()}: thread {tid[k] % self.per_block} of block {rows[k]} writes element {cols[k]}, which {other} "
                      f"{what} since the last BARRIER (a BARRIER is missing between them)")

  def barrier(self) -> None:
    if self.shared:
      self.writer.fill(-1)
      self.reader.fill(-1)

  def _in_range(self, cols: np.ndarray) -> None:
    n = self.data.shape[1]
    if cols.size and (cols.min() < 0 or cols.max() >= n):
      raise BackendError(f"{self.name()}: an access to element {int(cols.max() if cols.max() >= n else cols.min())} of {n}")


@dataclass
class BankCount:
  """How one instruction of a program that touches shared memory was served, over every launch so far: `warps` warp-wide
  executions, which took `wavefronts` passes through the 32 banks where `ideal` would do (one per quarter-warp for 16
  bytes a lane, per half-warp for 8, per warp for 4 or less; lanes reading one 4-byte word share its pass)."""
  op: str
  warps: int = 0
  wavefronts: int = 0
  ideal: int = 0

  @property
  def conflicts(self) -> int: return self.wavefronts - self.ideal


@dataclass
class EmulatedProgram:
  """A linearized program the PYTHON backend runs: its statements, parameters and loop structure; what each of its
  shared-memory instructions cost in bank passes (bank_counts, kept across launches)."""
  name: str
  uops: tuple[UOp, ...]
  params: tuple[UOp, ...]
  jumps: dict
  shared_offsets: dict = field(default_factory=dict)
  bank_counts: dict[UOp, BankCount] = field(default_factory=dict)


def wavefronts(addresses: np.ndarray, width: int) -> tuple[int, int]:
  """(passes, ideal passes) for lanes in consecutive warps of 32 accessing `width` bytes each at byte `addresses` of shared
  memory (32 banks of 4 bytes): a warp's access is served in phases (a quarter-warp each for 16 bytes a lane, a half-warp
  for 8, the whole warp for 4 or less), and a phase takes as many passes as the most distinct 4-byte words one bank holds."""
  lanes = 32 if width <= 4 else 128 // width
  words = max(1, width // 4)
  phase = np.repeat(np.arange(addresses.size, dtype=np.int64) // lanes, words)
  word = (addresses.astype(np.int64)[:, None] // 4 + np.arange(words)).reshape(-1)
  distinct = np.unique(phase * (1 << 32) + word)
  ph, wd = distinct >> 32, distinct & ((1 << 32) - 1)
  keys, per_bank = np.unique(ph * 32 + wd % 32, return_counts=True)
  most = np.zeros(int(ph.max()) + 1 if ph.size else 0, np.int64)
  np.maximum.at(most, keys // 32, per_bank)
  return int(most.sum()), int(np.count_nonzero(most))


def grid_coordinates(sizes: tuple[int, ...], flat: np.ndarray) -> list[np.ndarray]:
  """The coordinate along each range of a flat block (or thread) number: the first range is the most significant digit."""
  out = []
  for k, size in enumerate(sizes):
    below = int(np.prod(sizes[k + 1:], dtype=np.int64))
    out.append(((flat // below) % size).astype(np.int32))
  return out


@dataclass
class _Launch:
  """One launch being emulated: every thread's values so far (an array with one entry per thread, or a scalar when every
  thread agrees), the buffers by slot, the shared memory of the blocks, and each thread's number."""
  name: str
  buffers: dict[int, np.ndarray]
  threads: int
  blocks: int
  per_block: int
  tid: np.ndarray
  program: EmulatedProgram
  val: dict[UOp, object] = field(default_factory=dict)
  shared: dict[UOp, _Memory] = field(default_factory=dict)
  in_flight: list[list] = field(default_factory=list)    # the committed groups of cp.async copies not yet waited for
  issued: list = field(default_factory=list)             # the copies issued since the last ASYNC_COMMIT

  def banks(self, u: UOp, mem: _Memory, elements: np.ndarray, width: int, lanes: np.ndarray | None = None) -> None:
    """Count the bank passes of instruction u: every thread (or those of `lanes`) accesses `width` bytes of shared memory
    `mem` from element `elements` on."""
    at = mem.offset + np.broadcast_to(np.asarray(elements, np.int64), (self.threads,)) * mem.data.itemsize
    passes, ideal = wavefronts(at if lanes is None else at[lanes], width)
    c = self.program.bank_counts.setdefault(u, BankCount(u.op.name))
    c.warps += -(-self.threads // 32)    # every warp runs every instruction
    c.wavefronts += passes
    c.ideal += ideal


def _alloc(launch: _Launch, u: UOp) -> _Memory:
  if u.addrspace is AddrSpace.SHARED:     # one per launch, as a GPU's: a loop around it reuses the same memory
    if u not in launch.shared:
      launch.shared[u] = _Memory(u, launch.threads, launch.blocks, launch.per_block, launch.program.shared_offsets[u])
    return launch.shared[u]
  return _Memory(u, launch.threads, launch.blocks, launch.per_block)   # a thread's registers, fresh each time


def _index(launch: _Launch, u: UOp):
  base = launch.val[u.src[0]]
  if u.src[0].addrspace is AddrSpace.ALU: return np.asarray(base)[..., int(launch.val[u.src[1]])]   # an element of a STACK
  return (base, launch.val[u.src[1]])


def _load_element(launch: _Launch, mem, i):
  if isinstance(mem, _Memory): return mem.load(i, launch.tid)
  i = np.asarray(i)
  if i.size and (i.min() < 0 or i.max() >= mem.size): raise BackendError(f"{launch.name}: load of element {int(i.max())} of a buffer of {mem.size}")
  return mem[i]


def _load(launch: _Launch, u: UOp):
  mem, i = launch.val[u.src[0]]
  if isinstance(mem, _Memory) and mem.shared: launch.banks(u, mem, i, u.dtype.itemsize)
  if u.src[0].arg is None: return _load_element(launch, mem, i)
  # a vector: its n consecutive elements, each read as one element is (shared memory tracks every one)
  return np.stack(np.broadcast_arrays(*(np.asarray(_load_element(launch, mem, i + k)) for k in range(u.dtype.count))), axis=-1)


def _store(launch: _Launch, u: UOp) -> None:
  (mem, i), v = launch.val[u.src[0]], launch.val[u.src[1]]
  if isinstance(mem, _Memory) and mem.shared: launch.banks(u, mem, i, u.src[1].dtype.itemsize)
  lanes = [(i + k, np.asarray(v)[..., k]) for k in range(u.src[1].dtype.count)] if u.src[0].arg is not None else [(i, v)]
  for at, x in lanes:
    if isinstance(mem, _Memory): mem.store(at, x, launch.tid)
    else:
      at, x = np.broadcast_arrays(np.asarray(at), np.asarray(x))
      mem[at] = x


def _barrier(launch: _Launch, u: UOp) -> None:
  for m in launch.shared.values(): m.barrier()


def _wmma(launch: _Launch, u: UOp) -> np.ndarray:
  a, b, c = (np.broadcast_to(np.asarray(launch.val[s]), (launch.threads, s.shape[0])) for s in u.src)
  return wmma(a.astype(np.float32), b.astype(np.float32), c.astype(np.float32))


def _async_copy(launch: _Launch, u: UOp) -> None:
  """cp.async: each thread's 16 bytes are read now (a source it may not read is zeros) and land in shared memory when an
  ASYNC_WAIT waits for their group; until then the elements are the copy's (_Memory.issue)."""
  (dst, i), (src, j) = launch.val[u.src[0]], launch.val[u.src[1]]
  n = u.src[0].dtype.count
  valid = np.broadcast_to(np.asarray(launch.val[u.src[2]], bool), (launch.threads,))
  cols = np.broadcast_to(np.asarray(i, np.int64), (launch.threads,))[:, None] + np.arange(n)
  at = np.broadcast_to(np.asarray(j, np.int64), (launch.threads,))[valid][:, None] + np.arange(n)
  if at.size and (at.min() < 0 or at.max() >= src.size):
    bad = int(at.max() if at.max() >= src.size else at.min())
    raise BackendError(f"{launch.name}: a cp.async copy reads element {bad} of a buffer of {src.size}")
  values = np.zeros((launch.threads, n), src.dtype)
  values[valid] = src[at]
  launch.banks(u, dst, i, 16)
  dst.issue(cols, launch.tid)
  launch.issued.append((dst, cols, values))


def _async_commit(launch: _Launch, u: UOp) -> None:
  launch.in_flight.append(launch.issued)
  launch.issued = []


def _async_wait(launch: _Launch, u: UOp) -> None:
  while len(launch.in_flight) > u.arg:
    for mem, cols, values in launch.in_flight.pop(0): mem.complete(cols, values, launch.tid)


def ldmatrix(rows: np.ndarray, matrices: int, trans: bool) -> np.ndarray:
  """ldmatrix for every warp: rows (threads, 8), the row of 8 halves lane l points at (row l % 8 of matrix l // 8; lanes
  past 8 * matrices point nowhere) -> (threads, 2 * matrices): lane l's two elements of each matrix, (l // 4, 2 (l % 4) + e)
  of it, or of its transpose with trans (PTX ISA, "Warp-level matrix load instruction: ldmatrix")."""
  warps = rows.shape[0] // 32
  m = rows.reshape(warps, 4, 8, 8)[:, :matrices]           # (warp, matrix, row, column)
  if trans: m = m.transpose(0, 1, 3, 2)
  lane = np.arange(32)
  got = m[:, :, (lane // 4)[:, None], 2 * (lane % 4)[:, None] + np.arange(2)]   # (warp, matrix, lane, 2)
  return got.transpose(0, 2, 1, 3).reshape(warps * 32, 2 * matrices)


def _ldmatrix(launch: _Launch, u: UOp) -> np.ndarray:
  mem, i = launch.val[u.src[0]]
  n, trans = u.arg
  if launch.threads % 32: raise BackendError(f"{launch.name}: LDMATRIX needs whole warps of 32 threads, the launch has {launch.threads}")
  used = launch.tid[launch.tid % 32 < 8 * n]               # the lanes whose addresses the instruction reads
  start = np.broadcast_to(np.asarray(i, np.int64), (launch.threads,))
  launch.banks(u, mem, start, 16, lanes=used)               # (a thread's number is its place in the launch)
  rows = np.zeros((launch.threads, 8), mem.data.dtype)
  for c in range(8): rows[used, c] = mem.load(start[used] + c, used)
  return ldmatrix(rows, n, trans)


# the value of each statement for all threads at once, but a loop's RANGE and END (which move the program counter: see
# run_grid); None for an effect
STATEMENTS: dict[Ops, Callable[[_Launch, UOp], object]] = {
  Ops.CONST: lambda launch, u: np.asarray(u.arg, _np(u.dtype))[()],
  Ops.BUFFER: lambda launch, u: launch.buffers[u.arg.slot],
  Ops.ALLOC: _alloc,
  Ops.AFTER: lambda launch, u: launch.val[u.src[0]],
  Ops.INDEX: _index,
  Ops.LOAD: _load,
  Ops.STORE: _store,
  Ops.BARRIER: _barrier,
  Ops.SINK: lambda launch, u: None,
  Ops.STACK: lambda launch, u: np.stack(np.broadcast_arrays(*(np.asarray(launch.val[s]) for s in u.src)), axis=-1),
  Ops.VECTORIZE: lambda launch, u: np.stack(np.broadcast_arrays(*(np.asarray(launch.val[s]) for s in u.src)), axis=-1),
  Ops.GEP: lambda launch, u: np.asarray(launch.val[u.src[0]])[..., u.arg],
  Ops.WMMA: _wmma,
  Ops.ASYNC_COPY: _async_copy, Ops.ASYNC_COMMIT: _async_commit, Ops.ASYNC_WAIT: _async_wait, Ops.LDMATRIX: _ldmatrix,
  **dict.fromkeys(ALU, lambda launch, u: _alu(u, [launch.val[s] for s in u.src])),
}


def run_grid(program: EmulatedProgram, arrays: list[np.ndarray]) -> None:
  """Run `program` on the flat NumPy arrays `arrays` (one per parameter, in order), every thread of its grid at once."""
  lin, jumps = program.uops, program.jumps
  kinds = {AxisType.GLOBAL: [], AxisType.LOCAL: []}
  for u in sorted((u for u in lin if u.op is Ops.RANGE and u.arg.kind in kinds), key=lambda r: r.arg): kinds[u.arg.kind].append(u)
  gsizes = tuple(int(r.src[0].arg) for r in kinds[AxisType.GLOBAL])
  lsizes = tuple(int(r.src[0].arg) for r in kinds[AxisType.LOCAL])
  blocks, per_block = int(np.prod(gsizes, dtype=np.int64)), int(np.prod(lsizes, dtype=np.int64))
  threads = blocks * per_block
  tid = np.arange(threads, dtype=np.int64)
  coords = dict(zip(kinds[AxisType.GLOBAL], grid_coordinates(gsizes, tid // per_block)))
  coords.update(zip(kinds[AxisType.LOCAL], grid_coordinates(lsizes, tid % per_block)))
  launch = _Launch(program.name, {b.arg.slot: a for b, a in zip(program.params, arrays)}, threads, blocks, per_block, tid, program=program)
  val = launch.val
  pc, n = 0, len(lin)
  with np.errstate(all="ignore"):
    while pc < n:
      u = lin[pc]
      op = u.op
      if op is Ops.RANGE:
        if u in coords: val[u] = coords[u]           # a GLOBAL or LOCAL range: each thread's coordinate
        else:
          if int(val[u.src[0]]) <= 0: pc = jumps[pc] + 1; continue
          val[u] = np.int32(0)
      elif op is Ops.END:
        r = lin[jumps[pc]]
        if r not in coords:
          val[r] = np.int32(val[r] + 1)
          if val[r] < val[r.src[0]]: pc = jumps[pc] + 1; continue
      elif (statement := STATEMENTS.get(op)) is not None: val[u] = statement(launch, u)
      else: raise BackendError(f"{program.name}: the PYTHON backend has no rule for {op!r} (is the program lowered?)")
      pc += 1
  if launch.in_flight or launch.issued:
    raise BackendError(f"{program.name} ends with cp.async copies it never waited for ({len(launch.in_flight)} committed groups, "
                       f"{len(launch.issued)} copies not committed): an ASYNC_WAIT is missing")


class PythonBackend:
  """A GPU emulated with NumPy: slow, exact, and it reports races (see the module docstring)."""
  name = "PYTHON"
  renderer = None

  def __init__(self):
    # the GPU that CUDA lowers for (sm_80 and later): the same Opts and 16-byte vectors, so the emulator runs the kernels CUDA would
    self.caps = Caps(gpu=True, max_local=1024, fma=True, tensor_cores=True, vector_bytes=16)

  def compile(self, program: LinearProgram, name: str) -> EmulatedProgram:
    if not isinstance(program, LinearProgram): raise BackendError("the PYTHON backend runs LinearPrograms (it has no renderer)")
    for u in program.uops:
      if u.dtype.scalar() not in (dtypes.void, *_NP): raise BackendError(f"{name}: the PYTHON backend has no {u.dtype} values")
    return EmulatedProgram(name, program.uops, program.params, loop_jumps(list(program.uops)), shared_layout(program.uops)[0])

  def alloc(self, n: int, dtype: DType) -> np.ndarray: return np.zeros(n, _np(dtype))
  def copyin(self, handle: np.ndarray, array: np.ndarray) -> None: handle[...] = array
  def copyout(self, handle: np.ndarray) -> np.ndarray: return handle.copy()
  def launch(self, program: EmulatedProgram, handles: list[np.ndarray], global_size=None, local_size=None) -> None:
    run_grid(program, handles)
  def synchronize(self) -> None: pass


__all__ = ["PythonBackend", "RaceError", "run_grid", "wmma", "ldmatrix", "wavefronts", "BankCount", "grid_coordinates", "EmulatedProgram",
           "STATEMENTS"]
