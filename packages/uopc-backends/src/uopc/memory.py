"""uopc.memory: temporaries that share memory where their lifetimes don't overlap.

    lifetimes(uses, slots)           each slot's (first use, last use) from (time, slot, written) in time order
    share_buffers(spans, specs)      -> (slot -> buffer index, each buffer's (backend, size, dtype))
    schedule_temporaries(schedule, backend)   the same for a kernelize Schedule's temporaries

A schedule's temporaries (the values one kernel stores for later kernels of the same schedule) are each needed for a
stretch of it: a training step's activations from the forward pass to their gradient, a packed operand for one GEMM.
A Buffer each held them all at once: nanoGPT's step, 594 temporaries, 1.4 GiB. Given each temporary's span (the times
of its first and last use, in the order the runtime uses them), the largest first, a temporary takes the smallest
Buffer of its backend and dtype none of whose temporaries' spans meets its own (never one used in the same kernel: a
kernel's pointers must not alias), else one of its own. nanoGPT's step then needs 167 Buffers, 429 MiB (at most 396
MiB of its temporaries are alive at once).
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
  share, so that AddressSanitizer still sees a read past the end of each.

  Largest first (in bytes, then by first use), each temporary goes into the smallest Buffer already made (of its
  backend and dtype, so at least as large) none of whose temporaries' spans meets its own, else into a Buffer of its
  own. In order of first use, each taking the smallest free Buffer that held it or else growing the largest free one,
  small temporaries fragmented the large Buffers: nanoGPT's step planned 514 MiB where 396 MiB are alive at most at
  once; largest first, 429 MiB."""
  if exact is None: exact = sanitizing()
  held: list[tuple[Any, int, Any, list[tuple[int, int]]]] = []   # per Buffer: backend, size, dtype, its temporaries' spans
  where: dict[int, int] = {}
  for s in sorted(spans, key=lambda s: (-specs[s][1] * specs[s][2].itemsize, spans[s][0])):
    start, end = spans[s]
    backend, size, dtype = specs[s]
    best = None
    for g, (b, n, d, taken) in enumerate(held):
      if b is not backend or d is not dtype or (exact and n != size) or (best is not None and n >= held[best][1]): continue
      # (spans that meet share no Buffer, ends included: a kernel reading one and storing the other must not alias them)
      if all(e < start or end < f for f, e in taken): best = g
    if best is None:
      best = len(held)
      held.append((backend, size, dtype, []))
    held[best][3].append((start, end))
    where[s] = best
  for s, (backend, size, dtype) in specs.items():
    if s not in where:
      where[s] = len(held)
      held.append((backend, size, dtype, []))
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
