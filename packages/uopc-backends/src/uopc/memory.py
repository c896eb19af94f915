"""uopc.memory: temporaries that share memory where their lifetimes don't overlap.

    lifetimes(uses, slots)           each slot's (first use, last use) from (time, slot, written) in time order
    share_buffers(spans, specs)      -> (slot -> buffer index, each buffer's (backend, size, dtype))
    schedule_temporaries(schedule, backend)   the same for a kernelize Schedule's temporaries

A schedule's temporaries (the values one kernel stores for later kernels of the same schedule) are each needed for a
stretch of it: a training step's activations from the forward pass to their gradient, a packed operand for one GEMM.
A Buffer each held them all at once: nanoGPT's step, 594 temporaries, 1.4 GiB. Given each temporary's span (the times
of its first and last use, in the order the runtime uses them) a temporary takes the Buffer of one whose last use came
strictly before its first (never in the same kernel: a kernel's pointers must not alias), of the same backend and dtype,
the smallest that holds it or else the largest free one, grown. nanoGPT's step then needs 160 Buffers, 0.5 GiB.
run_schedule shares the temporaries of a planned schedule this way, and uopc.jit those of a capture.
"""
from __future__ import annotations
from typing import Any, Iterable
from uopc.backends import sanitizing


def lifetimes(uses: Iterable[tuple[int, int, bool]], slots) -> dict[int, tuple[int, int]]:
  """(first use, last use) of each of `slots` from its uses, (time, slot, written) in time order. A slot whose first use
  reads it (a value from before the run) has none: it keeps a Buffer of its own."""
  spans: dict[int, tuple[int, int]] = {}
  private: set[int] = set()
  for t, s, written in uses:
    if s not in slots or s in private: continue
    if s in spans: spans[s] = (spans[s][0], t)
    elif written: spans[s] = (t, t)
    else: private.add(s)
  return spans


def share_buffers(spans: dict[int, tuple[int, int]], specs: dict[int, tuple[Any, int, Any]],
                  exact: bool | None = None) -> tuple[dict[int, int], list[tuple[Any, int, Any]]]:
  """Buffers for temporaries: `spans` maps each shareable slot to (first use, last use), `specs` maps every slot to its
  (backend, size, dtype); a slot of specs without a span gets a Buffer of its own. Returns each slot's Buffer (an index)
  and each Buffer's (backend, size, dtype). `exact` (by default: under UOPC_SANITIZE): only temporaries of one size
  share, so that AddressSanitizer still sees a read past the end of each."""
  if exact is None: exact = sanitizing()
  held: list[list] = []                  # per Buffer: [backend, size, dtype, the last use of the temporary in it now]
  where: dict[int, int] = {}
  for s in sorted(spans, key=lambda s: spans[s][0]):
    start, end = spans[s]
    backend, size, dtype = specs[s]
    free = [g for g, (b, n, d, busy) in enumerate(held) if busy < start and b is backend and d is dtype and (n == size or not exact)]
    fits = [g for g in free if held[g][1] >= size]
    if fits: g = min(fits, key=lambda g: held[g][1])
    elif free: g = max(free, key=lambda g: held[g][1])
    else:
      g = len(held)
      held.append([backend, size, dtype, end])
    held[g][1], held[g][3] = max(held[g][1], size), end
    where[s] = g
  for s, (backend, size, dtype) in specs.items():
    if s not in where:
      where[s] = len(held)
      held.append([backend, size, dtype, 0])
  return where, [(b, n, d) for b, n, d, _ in held]


def schedule_temporaries(schedule, backend: Any) -> tuple[dict[int, int], list[tuple[Any, int, Any]]]:
  """share_buffers for the temporaries of a kernelize Schedule (its plan's table entries of kind "temporary": values
  its kernels store for its later kernels), by table index: each lives from the kernel that stores it (a row of
  Plan.slots: its inputs, then its output) to the last kernel that reads it. Under UOPC_SANITIZE only temporaries of one
  size share (share_buffers' `exact`)."""
  plan = schedule.plan
  specs = {i: (backend, *(schedule.temps[i] if u is None else (u.shape[0], u.dtype)))
           for i, (u, r) in enumerate(zip(schedule.table, plan.refs)) if r.kind == "temporary"}
  uses = ((k, s, j == len(row) - 1) for k, row in enumerate(plan.slots) for j, s in enumerate(row))
  return share_buffers(lifetimes(uses, specs), specs)


__all__ = ["lifetimes", "share_buffers", "schedule_temporaries"]
