"""uopc.profiling: what ran in this process while UOPC_DEBUG was set (uopc.runtime reports each compile and launch here).

    profile.launched(program, seconds)    a line per launch on stderr (program, output shape, time, GFLOP/s, GB/s)
    profile.compiled(program, seconds)    counted for the summary
    profile.summary()                     programs, launches, compile and run time, the top kernels by time; printed at exit

A program is anything with `name`, `backend.name`, `shape`, `flops` and `nbytes` (uopc.runtime.Program).
"""
from __future__ import annotations
import atexit, sys
from typing import Any


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


__all__ = ["profile"]
