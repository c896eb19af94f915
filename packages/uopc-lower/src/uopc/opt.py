"""uopc.opt: choosing the Opts a kernel is lowered with, from what the backend can do.

    choose_opts(kernel, caps) -> Opts

`Caps` is what a backend tells the optimizer about its machine: how many threads run a parallel loop, how many
f32 lanes a vector holds, the cache sizes a tile should fit, whether it is a GPU (and how many threads a block may
have). uopc.runtime asks for Opts here whenever a kernel is compiled without explicit ones.

For now the choice is the plain lowering (default Opts: one loop per axis, nothing unrolled, one thread), which
every backend runs correctly; the heuristics that read the kernel (strides, reduce sizes, output size) come with
the optimization chapter.
"""
from __future__ import annotations
from dataclasses import dataclass
from uopc.rangeify import Opts
from uopc.kernelize import Kernel


@dataclass(frozen=True)
class Caps:
  """What a backend's machine offers the optimizer."""
  threads: int = 1                  # threads a parallel (THREAD) loop is split across
  vector_width: int = 1             # f32 lanes in one SIMD register
  l1_bytes: int = 32 * 1024         # per-core data cache
  l2_bytes: int = 1024 * 1024
  gpu: bool = False                 # lowers to GLOBAL/LOCAL ranges, shared memory and barriers
  max_local: int = 1                # threads per block (GPU)


def choose_opts(kernel: Kernel, caps: Caps) -> Opts:
  """The Opts to lower `kernel` with on a machine described by `caps`."""
  return Opts()


__all__ = ["Caps", "choose_opts"]
