"""uopc.profiling: what ran in this process while UOPC_DEBUG was set (uopc.runtime reports each compile and launch here).

    profile.launched(program, seconds)    a line per launch on stderr (program, output shape, time, GFLOP/s, GB/s)
    profile.compiled(program, seconds)    counted for the summary
    profile.summary()                     programs, launches, compile and run time, the top kernels by time; printed at exit

A program is anything with `name`, `backend.name`, `shape`, `flops` and `nbytes` (uopc.runtime.Program), whose FLOPs,
bytes and launch grid launch_cost and launch_grid read off its linearized program (format_linear prints one).
"""
from __future__ import annotations
import atexit, sys
from typing import Any, Sequence
from uopc.uop import UOp, Ops, AxisType, ALU
from uopc.symbolic import bounds
from uopc.gpulower import WMMA_K, WMMA_M, WMMA_N


class _Profile:
  """What ran in this process while UOPC_DEBUG was set: the one piece of process-wide state here, printed at exit."""
  def __init__(self):
    self.runs: dict[Any, list] = {}    # program -> [launches, seconds]
    self.compile_seconds = 0.0
    self.compiled_count = 0
    self._registered = False

  def _register(self):
    if not self._registered:
      self._registered = True
      atexit.register(self._at_exit)

  def _at_exit(self):
    if self.runs or self.compiled_count: print(self.summary(), file=sys.stderr)

  def compiled(self, prog: Any, seconds: float) -> None:
    self._register()
    self.compile_seconds += seconds
    self.compiled_count += 1

  def launched(self, prog: Any, seconds: float) -> None:
    self._register()
    entry = self.runs.setdefault(prog, [0, 0.0])
    entry[0] += 1
    entry[1] += seconds
    gflops, gbs = prog.flops / seconds / 1e9 if seconds else 0.0, prog.nbytes / seconds / 1e9 if seconds else 0.0
    print(f"uopc {prog.backend.name:<6} {prog.name:<28} {str(prog.shape):<20} {seconds * 1e3:9.3f} ms {gflops:9.2f} GFLOP/s "
          f"{gbs:8.2f} GB/s", file=sys.stderr)

  def summary(self, top: int = 10) -> str:
    total = sum(s for _, s in self.runs.values())
    launches = sum(n for n, _ in self.runs.values())
    lines = [f"uopc summary: {len(self.runs)} kernels, {launches} launches, compile {self.compile_seconds:.3f} s "
             f"({self.compiled_count} programs), run {total:.3f} s"]
    ranked = sorted(self.runs.items(), key=lambda kv: -kv[1][1])[:top]
    if ranked: lines.append("uopc top kernels by time:")
    for prog, (n, s) in ranked:
      lines.append(f"  {s * 1e3:10.3f} ms {100 * s / total if total else 0:5.1f}% {n:6d} x  {prog.name:<28} "
                   f"{prog.flops * n / s / 1e9 if s else 0:9.2f} GFLOP/s {prog.nbytes * n / s / 1e9 if s else 0:8.2f} GB/s")
    return "\n".join(lines)


profile = _Profile()


def launch_grid(lin: Sequence[UOp], kind: AxisType) -> tuple[int, ...] | None:
  """The launch grid's sizes along the GLOBAL (or LOCAL) ranges, in range order; None when the program has none."""
  sizes = [bounds(u.src[0])[1] for u in sorted((u for u in lin if u.op is Ops.RANGE and u.arg.kind is kind), key=lambda r: r.arg)]
  return tuple(sizes) or None


# a WMMA is one lane's share of a warp's m16n8k16 multiply-add (the 32 lanes are a LOCAL range around it)
WMMA_LANE_FLOPS = 2 * WMMA_M * WMMA_N * WMMA_K // 32


def launch_cost(lin: Sequence[UOp], params: tuple[UOp, ...]) -> tuple[int, int]:
  """(FLOPs, bytes) of one launch: every float ALU op (on a vector, one per lane; a fused multiply-add two, and a WMMA
  its lane's share of the warp's 2 * 16 * 8 * 16) times the trip count of the loops around it (index arithmetic is not
  counted), and every parameter's memory once. An n x n x n GEMM counts 2 n^3, however it is lowered."""
  trips, flops = [1], 0
  for u in lin:
    if u.op is Ops.RANGE: trips.append(trips[-1] * max(0, bounds(u.src[0])[1]))
    elif u.op is Ops.END: trips.pop()
    elif u.op is Ops.WMMA: flops += trips[-1] * WMMA_LANE_FLOPS
    elif u.op in ALU and u.op is not Ops.CAST and (u.dtype.is_float or u.src[0].dtype.is_float):
      flops += trips[-1] * u.src[0].dtype.count * (2 if u.op is Ops.MULACC else 1)
  return flops, sum(b.shape[0] * b.dtype.itemsize for b in params)


def format_linear(lin: Sequence[UOp]) -> str:
  """A linearized program, one statement per line, indented by loop: number, op, dtype, arg, sources by number."""
  ids = {u: i for i, u in enumerate(lin)}
  lines, depth = [], 0
  for i, u in enumerate(lin):
    if u.op is Ops.END: depth -= 1
    arg = "" if u.arg is None else repr(u.arg)
    lines.append(f"{i:4d} {'  ' * depth}{u.op.name:<8} {u.dtype.name:<5} {arg[:48]:<48} {[ids[s] for s in u.src]}")
    if u.op is Ops.RANGE: depth += 1
  return "\n".join(lines)


__all__ = ["profile"]   # (launch_cost, launch_grid and format_linear are uopc.runtime's; it exports format_linear)
