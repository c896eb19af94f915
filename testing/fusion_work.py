"""The work a schedule's kernels do, counted on their lowered programs, and the least any schedule of the same graph could
do: the oracle that the fusion pins (uopc-lower's test_kernelize.py, uopc-tensor's test_fusion_pins.py) bound
kernelize's decisions with. A kernel count alone misses a schedule with as many kernels that recomputes a costly value
once per column of a broadcast.

  * executed: every float ALU op of each kernel's lowered program (default Opts: scalar loops), times the trip count of
    the loops open around it (a RANGE opens one, its END closes it); index arithmetic (i32) is not counted;
  * least: every float ALU op of the graph evaluated once per element of its shape, and a REDUCE's combine once per
    element it reads (what a schedule that stores every intermediate does). Lowering hoists an op of loop-invariant
    values out of its loops (a division by a broadcast scalar), so executed can be below it.

Both count the transcendentals (EXP2, LOG2, SIN, SQRT, RECIP) apart too."""
from __future__ import annotations
from uopc.uop import UOp, Ops, ALU, prod
from uopc.rangeify import lower
from uopc.linearize import linearize

TRANSCENDENTAL = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP}


def is_float_op(u: UOp) -> bool:
  """A float ALU op: one that computes or compares floats (index arithmetic and masks over indices are i32 and bool)."""
  return u.op in ALU and u.op is not Ops.CAST and (u.dtype.is_float or any(s.dtype.is_float for s in u.src))


def executed(kernels) -> tuple[int, int]:
  """(float ALU ops, transcendentals) that the kernels (uopc.kernelize.Kernel) execute."""
  ops = trans = 0
  for k in kernels:
    trips = [1]
    for u in linearize(lower(k.canonical_root, k.canonical_out)):
      if u.op is Ops.RANGE: trips.append(trips[-1] * u.src[0].arg)
      elif u.op is Ops.END: trips.pop()
      elif is_float_op(u):
        ops += trips[-1]
        trans += trips[-1] if u.op in TRANSCENDENTAL else 0
  return ops, trans


def least(roots: list[UOp]) -> tuple[int, int]:
  """(float ALU ops, transcendentals) of the graph of `roots` with every node evaluated once per element."""
  ops = trans = 0
  for u in UOp(Ops.SINK, tuple(roots)).toposort():
    if u.op is Ops.REDUCE and u.dtype.is_float: ops += prod(u.src[0].shape)
    elif is_float_op(u):
      ops += prod(u.shape)
      trans += prod(u.shape) if u.op in TRANSCENDENTAL else 0
  return ops, trans
