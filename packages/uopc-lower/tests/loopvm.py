"""A tiny interpreter of linearized loop programs: the oracle for uopc-lower's tests, which can't use a C compiler.

It runs the list that `linearize` returns top to bottom: RANGE starts a loop (the body runs again at its END while
the counter is below the end), ALLOC makes a fresh accumulator, INDEX/LOAD/STORE touch memory, and every value
is computed with the evaluator's scalar semantics (uopc.evaluate.exec_alu), so it agrees with the C backend.
Because it follows the linearizer's order literally, a misplaced node gives a wrong answer or a missing value.
"""
from __future__ import annotations
from uopc.uop import UOp, Ops
from uopc.evaluate import exec_alu, cast_value
from uopc.linearize import linearize


def run_program(sink: UOp, buffers: dict[int, list]) -> dict[int, list]:
  lin = linearize(sink)
  val: dict[UOp, object] = {}
  allocs: dict[UOp, list] = {}
  loops: list[tuple[UOp, int]] = []       # (RANGE, pc of its first body node)
  pc = 0
  while pc < len(lin):
    u = lin[pc]
    op = u.op
    if op is Ops.CONST: val[u] = u.arg
    elif op is Ops.BUFFER: val[u] = buffers[u.arg.slot]
    elif op is Ops.ALLOC: val[u] = allocs[u] = [None] * u.arg.shape[0]
    elif op is Ops.AFTER: val[u] = val[u.src[0]]
    elif op is Ops.RANGE:
      if val[u.src[0]] <= 0:                # an empty loop: skip to its END
        pc += 1
        while not (lin[pc].op is Ops.END and lin[pc].src[1] is u): pc += 1
        pc += 1
        continue
      val[u] = 0
      loops.append((u, pc + 1))
    elif op is Ops.END:
      r, start = loops[-1]
      assert r is u.src[1], "END closes a loop that is not the innermost open one"
      val[r] += 1
      if val[r] < val[r.src[0]]:
        pc = start
        continue
      loops.pop()
    elif op is Ops.INDEX: val[u] = (val[u.src[0]], val[u.src[1]])
    elif op is Ops.LOAD:
      mem, i = val[u.src[0]]
      assert 0 <= i < len(mem), f"load out of bounds: {i} of {len(mem)}"
      assert mem[i] is not None, "load of an accumulator before its first store"
      val[u] = mem[i]
    elif op is Ops.STORE:
      mem, i = val[u.src[0]]
      assert 0 <= i < len(mem), f"store out of bounds: {i} of {len(mem)}"
      mem[i] = val[u.src[1]]
    elif op in (Ops.SINK, Ops.BARRIER): pass
    elif op is Ops.CAST: val[u] = cast_value(val[u.src[0]], u.dtype)
    else: val[u] = exec_alu(op, u.dtype, *(val[s] for s in u.src))
    pc += 1
  return buffers
