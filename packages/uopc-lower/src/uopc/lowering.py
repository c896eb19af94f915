"""The vocabulary of lowering, shared by rangeify (the index rules) and gpulower (the GPU reductions and GEMMs):

    Opts        how a kernel is mapped onto the machine: a frozen value, validated from its fields' types
    Ctx         the state of one lowering: range and accumulator counters, memos, the Opts, and GpuState
    GpuState    what GPU lowering records as it goes: each output axis's GpuAxis, the GEMM being staged or put on
                tensor cores (Gemm, TensorCoreTile), its results
    Walk        how one axis is walked: index = (base * factor + copy) * width + lane
    ravel / unravel / ranges_in     the index arithmetic both sides build with

Opts is the single source of truth for its options: its constructor checks each field by the field's declared type,
`to_dict`/`from_dict` (what uopc.search stores) go over `dataclasses.fields`, and each field's metadata says whether
it is a CPU or a GPU option (check_opts refuses it on the other machine, in the words of its metadata).
"""
from __future__ import annotations
import dataclasses, operator, typing
from dataclasses import dataclass, field
from typing import NamedTuple
from uopc.uop import UOp, Ops, ParamArg, AxisType, range_
from uopc.dtype import AddrSpace, DType


class LowerError(Exception):
  """A shaped graph that can't be lowered to loops (an op with no index rule, a bad output buffer, bad Opts)."""


# ---- index helpers ----------------------------------------------------------------------------------------------------

def ravel(idx: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
  """The row-major position of index idx in shape, by Horner's rule: ((i0*s1 + i1)*s2 + i2)..."""
  position = UOp.const(0)
  for coord, size in zip(idx, shape): position = position * size + coord
  return position


def unravel(flat: UOp, shape: tuple[int, ...]) -> tuple[UOp, ...]:
  """The index in shape of row-major position `flat`. Axis k's coordinate is (flat // (product of the sizes after k))
  % size_k; an axis of size 1 is always at 0, so it gets a CONST rather than a `% 1`."""
  coords: list[UOp] = []
  below = 1                    # the product of the sizes to the right of the axis being peeled
  for size in shape[::-1]:
    coords.insert(0, UOp.const(0) if size == 1 else (flat // below) % size)
    below *= size
  return tuple(coords)


def ranges_in(*us: UOp) -> list[UOp]:
  """The RANGEs the expressions mention (syntactically), in loop order."""
  found = {n for u in us for n in u.toposort() if n.op is Ops.RANGE}
  return sorted(found, key=lambda r: r.arg)


class Walk(NamedTuple):
  """How one axis is walked: index = (base * factor + c) * width + lane, for each unrolled copy c < factor. `base` is a
  RANGE, or CONST 0 when one step covers the axis (or, for a segment of a split loop, its first step plus a RANGE, or
  that step alone); `lane` is an UPCAST RANGE of `width` (one SIMD vector) or None."""
  base: UOp
  factor: int
  lane: UOp | None = None
  width: int = 1


class Chunks(NamedTuple):
  """The loops of a long float sum (rangeify's chunked sums). Position `at` of the reduction's walks is the innermost
  loop's; `walk` is it over one chunk (chunk * SUM_CHUNK + inner), summed into a partial over `inner`, and the partials
  are added to the total once per iteration of `others` (the reduction's other loops) and of `chunk` (None when the
  innermost loop is one chunk or less). `tail` is the walk over the last steps that fill no chunk (over `tail_loop`,
  or one step), added to the total directly."""
  at: int
  walk: Walk
  inner: UOp
  others: tuple[UOp, ...]
  chunk: UOp | None = None
  tail: Walk | None = None
  tail_loop: UOp | None = None


class ReduceLoops(NamedTuple):
  """The loops of one reduction at one set of output ranges: a Walk per reduced axis, and their chunks for a long sum."""
  walks: list[Walk]
  chunks: Chunks | None


# ---- Opts -------------------------------------------------------------------------------------------------------------

Pairs = tuple[tuple[int, int], ...]     # {axis: n}, kept as (axis, n) pairs sorted by axis


def _cpu(default, why: str): return field(default=default, metadata={"machine": "cpu", "elsewhere": why})
def _gpu(default, why: str): return field(default=default, metadata={"machine": "gpu", "elsewhere": why})

_NO_VECTORS = "GPU kernels take no SIMD vectors: threads are their lanes"
_NO_CPU_LOOPS = "a GPU kernel has no CPU threads or cache tiles"
_GPU_OPTION = "is a GPU option: it needs gpu=True"


@dataclass(frozen=True)
class Opts:
  """How to map a kernel onto the machine. Chosen by uopc.opt, applied during rangeify.

  A value: frozen, hashable, equal when equal, so it can key a program cache and a search can't time one choice
  twice under two names. The per-axis fields take a dict ({axis: size}) and keep it as sorted (axis, size) pairs;
  `dict(opts.upcast)` reads one back. `lower` checks every entry against the kernel (`check_opts`): a factor that
  doesn't divide its axis, an axis that doesn't exist or unroll < 1 is an error, never silently dropped."""
  upcast: Pairs = ()                                        # {output axis: how many of its elements each iteration computes}
  thread: int | None = _cpu(None, _NO_CPU_LOOPS)            # the output axis OpenMP splits across threads
  unroll: int = 1                                           # how far the innermost reduce loop is unrolled
  tile: Pairs = _cpu((), _NO_CPU_LOOPS)                     # {output axis: cache block}: loop over blocks, then inside one
  gpu: bool = False                                         # map the output axes to GLOBAL ranges (blockIdx), not loops
  local: Pairs = _gpu((), "threads per block need gpu=True")   # {output axis: threads per block on it} (LOCAL ranges)
  vector: tuple[int, int] | None = _cpu(None, _NO_VECTORS)  # (output axis, lanes): its innermost lanes are one SIMD vector
  reduce_vector: int = _cpu(1, _NO_VECTORS)                 # lanes of partial accumulators on each reduction's innermost axis
  fma: bool = False                                         # a sum of products accumulates with fused multiply-adds (MULACC)
  group: int = _gpu(1, _GPU_OPTION)                         # threads of a block that share each reduction (in shared memory)
  stage: int = _gpu(0, _GPU_OPTION)                         # GEMM: depth of the operand tiles staged in shared memory (0: none)
  tc: bool = _gpu(False, _GPU_OPTION)                       # GEMM of f16 operands: tensor cores (WMMA); local = warps, upcast = tiles
  split: bool = _cpu(False, "a GPU kernel's last axis is its threads, no loop to split")   # the last loop, where a concatenation changes branch
  inner: Pairs = _cpu((), _NO_CPU_LOOPS)                    # {output axis: block}: walked in blocks, each block's steps innermost

  def __post_init__(self):
    for name, check in _FIELD_CHECKS.items(): object.__setattr__(self, name, check(name, getattr(self, name)))
    # an upcast or a block of 1 is no upcast: one kernel, one Opts (a cache or a search must not see two)
    object.__setattr__(self, "upcast", tuple(p for p in self.upcast if p[1] != 1))
    object.__setattr__(self, "local", tuple(p for p in self.local if p[1] != 1))

  def to_dict(self) -> dict:
    """Every field as JSON data (tuples become lists); Opts.from_dict reads it back."""
    return {f.name: _as_lists(getattr(self, f.name)) for f in dataclasses.fields(self)}

  @staticmethod
  def from_dict(d: dict) -> Opts:
    """The Opts that to_dict wrote: every field named, each checked as the constructor checks it."""
    names = {f.name for f in dataclasses.fields(Opts)}
    if not isinstance(d, dict) or set(d) != names:
      raise LowerError(f"Opts.from_dict takes a dict of the fields {sorted(names)}, got {d!r:.200}")
    return Opts(**{k: _as_tuples(v) for k, v in d.items()})


def _as_lists(v): return [_as_lists(x) for x in v] if isinstance(v, tuple) else v
def _as_tuples(v): return tuple(_as_tuples(x) for x in v) if isinstance(v, list) else v


def _pairs(name: str, v) -> Pairs:
  """{axis: n} or ((axis, n), ...) as a sorted tuple of int pairs: the hashable form Opts keeps."""
  items = v.items() if isinstance(v, dict) else v
  try: pairs = tuple(sorted((operator.index(k), operator.index(n)) for k, n in items))
  except (TypeError, ValueError): raise LowerError(f"Opts.{name} takes {{axis: size}}, got {v!r}") from None
  if len({k for k, _ in pairs}) != len(pairs): raise LowerError(f"Opts.{name} names an axis twice: {v!r}")
  return pairs


def _int(name: str, v) -> int:
  if type(v) is not int: raise LowerError(f"Opts.{name} is an int, got {v!r}")
  return v


def _bool(name: str, v) -> bool:
  if type(v) is not bool: raise LowerError(f"Opts.{name} is a bool, got {v!r}")
  return v


def _axis(name: str, v) -> int | None:
  if v is not None and type(v) is not int: raise LowerError(f"Opts.{name} is an axis number, got {v!r}")
  return v


def _lanes(name: str, v) -> tuple[int, int] | None:
  if v is None: return None
  try: axis, lanes = (operator.index(x) for x in v)
  except (TypeError, ValueError): raise LowerError(f"Opts.{name} is (axis, lanes), got {v!r}") from None
  return None if lanes == 1 else (axis, lanes)


# each field is checked (and brought to its one hashable form) by its declared type
_CHECK_BY_TYPE = {Pairs: _pairs, int: _int, bool: _bool, int | None: _axis, tuple[int, int] | None: _lanes}
_FIELD_CHECKS = {name: _CHECK_BY_TYPE[hint] for name, hint in typing.get_type_hints(Opts).items()}


# ---- GPU state ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gemm:
  """A kernel whose one reduction is an f32 sum over its last axis of x * y, reached from the root through elementwise
  ops only (a cast, a bias): x moves along output axis i and not j, y along j and not i. With f16=True, x and y are
  casts of f16 values (x16, y16), which tensor cores take as they are. Found by rangeify.gemm_pattern."""
  reduce: UOp
  x: UOp
  y: UOp
  i: int
  j: int
  k: int                      # the reduced size
  x16: UOp | None = None
  y16: UOp | None = None
  # how 16-byte copies read x16 and y16 (rangeify.copy_along_k): along k (True), along their output axis (False), or
  # not at all (None: a pipelined tensor-core GEMM, Opts(tc=True, stage=S), needs both)
  x_along_k: bool | None = None
  y_along_k: bool | None = None
  # the same for x and y themselves, whatever their dtype: which way a staged GEMM's threads copy each operand's tile,
  # so that neighbouring threads read neighbouring memory (None: not plain reads, copied along k)
  x_runs_k: bool | None = None
  y_runs_k: bool | None = None
  root: UOp | None = None     # the kernel's root as stage and tc lower it: rangeify.gemm_form's, the sum at its own index

  @property
  def f16(self) -> bool: return self.x16 is not None


class GpuAxis(NamedTuple):
  """How a GPU kernel walks one output axis: blocks of `threads` threads, each computing `per_thread` elements, so
  index = origin + thread * per_thread + c with origin = block * threads * per_thread."""
  origin: UOp                 # the first element of this block's tile on the axis
  thread: UOp | None          # the LOCAL range of the block's threads on it; None with one thread
  threads: int
  per_thread: int


class TensorCoreTile(NamedTuple):
  """Where a warp's tensor-core tiles lie: the block's tile starts at (row, col) on the GEMM's i and j axes; the warp is
  at (warp_i, warp_j) among the block's warps (a LOCAL range, or CONST 0 with one warp on the axis); `lane` is its
  thread (0..31), and it computes tiles_i x tiles_j tiles of 16x8 outputs."""
  row: UOp
  col: UOp
  warp_i: UOp
  warp_j: UOp
  lane: UOp
  tiles_i: int
  tiles_j: int


class Fragment(NamedTuple):
  """Which accumulator element a tensor-core output index is: tile (tile_i, tile_j) of the warp, element `element` of
  the 4 its lane holds."""
  tile_i: int
  tile_j: int
  element: int


@dataclass
class GpuState:
  """What lowering with Opts(gpu=True) records as it goes (uopc.gpulower reads it)."""
  axes: dict[int, GpuAxis] = field(default_factory=dict)          # output axis -> how its blocks and threads walk it
  outputs: list[tuple[UOp, ...]] = field(default_factory=list)    # the output indices one thread stores
  group_lane: UOp | None = None                                   # the LOCAL range a block's threads share reductions over
  gemm: Gemm | None = None                                        # the GEMM staged in shared memory or put on tensor cores
  gemm_results: dict[tuple[UOp, ...], UOp] = field(default_factory=dict)   # its value at each output index
  tc: TensorCoreTile | None = None                                # the tensor cores' layout
  tc_fragments: dict[tuple[UOp, ...], Fragment] = field(default_factory=dict)   # output index -> its accumulator element


# ---- the lowering context ---------------------------------------------------------------------------------------------

@dataclass
class Ctx:
  """The state of one lowering: range and accumulator counters, the memos, the Opts."""
  next_range: int = 0                                    # the idx of the next RANGE: loops nest in this order
  next_alloc: int = 0                                    # the slot of the next accumulator
  memo: dict[tuple[UOp, tuple[UOp, ...]], UOp] = field(default_factory=dict)     # (node, index) -> its scalar value
  reduce_ranges: dict[tuple[UOp, frozenset[UOp]], ReduceLoops] = field(default_factory=dict)   # (REDUCE, its output ranges) -> its loops
  opts: Opts = field(default_factory=Opts)
  # a long float sum accumulates in chunks (see rangeify); uopc.opt reads a kernel's loops with it off, as the plain loops
  chunk_sums: bool = True
  gpu: GpuState = field(default_factory=GpuState)
  selectors: list[UOp] = field(default_factory=list)     # each STACK's branch index, as rangeify met them (Opts.split)

  def rng(self, size: int, kind: AxisType = AxisType.LOOP) -> UOp:
    """A fresh RANGE of `size` iterations."""
    r = range_(size, self.next_range, kind)
    self.next_range += 1
    return r

  def alloc(self, d: DType, n: int = 1, addrspace: AddrSpace | None = None) -> UOp:
    """A fresh accumulator: n elements of call-scope storage (of a thread; AddrSpace.SHARED: of a GPU block)."""
    a = UOp(Ops.ALLOC, (), ParamArg(self.next_alloc, d, (n,), addrspace))
    self.next_alloc += 1
    return a


__all__ = ["LowerError", "ravel", "unravel", "ranges_in", "Walk", "Chunks", "ReduceLoops", "Opts", "Pairs", "Gemm", "GpuAxis",
           "TensorCoreTile", "Fragment", "GpuState", "Ctx"]
