"""uopc.search: timing candidate Opts for a kernel on its real buffers, and storing the winner on disk.

    UOPC_SEARCH=1 python train.py                            every kernel met for the first time is searched
    uopc tune train.py                                       the same, then a report of what the search found
    run_schedule(kernels, backend, buffers, policy=SEARCH)   the same for a schedule run on uopc.runtime directly

The heuristics (uopc.opt.choose_opts) read a kernel; a search measures it. It times the heuristics' choice and the
candidates around it (uopc.opt.candidates) on the kernel's real inputs (the output goes to a scratch buffer), the best
of a few launches each, within a time budget per kernel (UOPC_SEARCH_BUDGET seconds, 3 by default: compiling a
candidate is the slow part, so the budget is checked between candidates). A candidate wins only if it beats the
heuristics' choice by MARGIN, so noise never replaces a good choice with an equal one.

The search is a policy of uopc.runtime (an OptsPolicy that measures): the runtime hands it each kernel's input Buffers
before the kernel first runs. Whoever runs kernels passes it: `policy_from_env()` gives it where UOPC_SEARCH is set
(Tensor's realize asks so), `uopc tune` sets UOPC_SEARCH for the script it runs. The winner is stored with
uopc.runtime.store_opts (under $UOPC_CACHE_DIR/opts, keyed by the canonical kernel, the backend, its capabilities and
its compiler; a damaged entry is ignored, searched again and rewritten), and every later run, searching or not, uses
it without timing anything: the runtime's default policy reads it.
"""
from __future__ import annotations
import os, time
from typing import Callable, Sequence
from uopc.lowering import Opts, LowerError
from uopc.kernelize import Kernel
from uopc.opt import choose_opts, candidates
from uopc.backends import Backend, BackendError
from uopc.runtime import Buffer, OptsPolicy, DEFAULT_POLICY, backend_caps, compile_kernel, kernel_name, stored_opts, store_opts

MARGIN = 0.97      # a candidate must take at most 97% of the heuristics' time to replace it
LAUNCHES = 3       # timed launches per candidate (after one warm-up); the best counts


def time_launches(program, buffers: Sequence) -> float:
  """The best of LAUNCHES timed launches (after a warm-up), waiting for each to finish."""
  program(buffers)
  backend = program.backend
  best = float("inf")
  for _ in range(LAUNCHES):
    backend.synchronize()
    start = time.perf_counter()
    program(buffers)
    backend.synchronize()
    best = min(best, time.perf_counter() - start)
  return best


# what this process searched, for `uopc tune`'s report: (kernel name, heuristics' seconds, best seconds, best Opts)
searched: list[tuple[str, float, float, Opts]] = []


def search_opts(kernel: Kernel, backend: Backend, inputs: Sequence, budget: float | None = None,
                timer: Callable | None = None, clock: Callable[[], float] = time.perf_counter) -> Opts:
  """Time the heuristics' choice and its candidates for `kernel` on `inputs` (Buffers, in kernel.inputs' order), keep the
  fastest if it wins by MARGIN, store it on disk and return it. `timer(program, buffers) -> seconds` and `clock` are
  there for tests; by default launches are timed for real."""
  if budget is None: budget = float(os.environ.get("UOPC_SEARCH_BUDGET") or 3.0)
  timer = timer or time_launches
  caps = backend_caps(backend)
  base = choose_opts(kernel, caps)
  scratch = Buffer(backend, kernel.out.shape[0], kernel.out.dtype)
  args = list(inputs) + [scratch]
  start = clock()
  times: dict[Opts, float] = {}
  for o in candidates(kernel, caps, base):
    if o is not base and clock() - start > budget: break
    try: prog = compile_kernel(kernel, backend, o)
    except (LowerError, BackendError): continue      # Opts the kernel or the backend refuses, a compiler's CompileError
    times[o] = timer(prog, args)
  if base not in times: return base
  best = min(times, key=times.__getitem__)
  if times[best] > MARGIN * times[base]: best = base
  store_opts(kernel, backend, best, seconds=times[best], heuristic_seconds=times[base], candidates=len(times))
  searched.append((kernel_name(kernel), times[base], times[best], best))
  return best


class Search(OptsPolicy):
  """The runtime's policy while searching: before a kernel first runs, it is searched on its inputs unless a choice is
  stored for it already; then, like the default policy, the stored choice is used."""
  measures = True

  def first_run(self, kernel: Kernel, backend: Backend, inputs: list[Buffer]) -> None:
    if stored_opts(kernel, backend) is None: search_opts(kernel, backend, inputs)


SEARCH = Search()


def policy_from_env() -> OptsPolicy:
  """SEARCH where UOPC_SEARCH is set (and not 0), else the runtime's default policy: for the code that runs kernels on
  a user's behalf (Tensor's realize), which reads the variable where it is called."""
  return SEARCH if os.environ.get("UOPC_SEARCH", "").strip() not in ("", "0") else DEFAULT_POLICY


def report() -> str:
  """What this process's searches found: per kernel, the heuristics' time, the best time and, when they differ, its Opts."""
  if not searched: return "uopc tune: no kernel was searched (every one had a cached choice, or none ran)"
  lines = [f"uopc tune: searched {len(searched)} kernels"]
  for name, base, best, o in searched:
    lines.append(f"  {name:<28} heuristic {base * 1e3:9.3f} ms  best {best * 1e3:9.3f} ms  x{base / best:5.2f}" +
                 ("" if base == best else f"  {o}"))
  return "\n".join(lines)


__all__ = ["search_opts", "Search", "SEARCH", "policy_from_env", "report", "time_launches", "MARGIN"]
