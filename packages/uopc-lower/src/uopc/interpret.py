"""The reference interpreter of linearized programs: what `linearize` returns, run one statement at a time.

    run_linear(lin, memory)    memory: {BUFFER slot: a mutable sequence of python values}, updated in place

It reads the list top to bottom, as the C renderer prints it: a RANGE starts a loop (its body runs again at its
END while the counter is below the end; an empty loop is skipped), an ALLOC makes fresh storage each time it is
reached, INDEX/LOAD/STORE touch memory (a vector INDEX its n consecutive elements), a vector (uopc.vectorize) is a
tuple of its lanes and an op on vectors works lane by lane, and every value is computed with the evaluator's scalar semantics
(`uopc.evaluate.exec_alu`), which are the C backend's: i32 wraps, f32 rounds, MAX propagates NaN, and integer
division by zero gives NumPy's 0 as the compiled code does. Because it follows the linearizer's order
literally, a misplaced node gives a wrong answer or a read of storage that was never written, which it reports.

It is slow and exact. uopc-lower's tests use it as their oracle (they have no C compiler), a test backend written
only against the backend contract runs Tensor programs on it, and GPU emulation builds on it: GLOBAL and LOCAL
ranges run here as plain loops, one thread after another, and a BARRIER does nothing (so a program whose threads
share memory needs the PYTHON backend, uopc.backends.python, which runs every thread at once and checks for races).
"""
from __future__ import annotations
from typing import Callable, MutableSequence
from uopc.uop import UOp, Ops, ALU
from uopc.evaluate import exec_alu, cast_value


class InterpretError(Exception):
  """A linearized program that can't run: a memory access out of bounds, a read before any write, a loop never closed."""


def loop_jumps(lin: list[UOp]) -> dict[int, int]:
  """For each RANGE, the position of its END, and for each END, the position of its RANGE."""
  opened: dict[UOp, int] = {}
  jumps: dict[int, int] = {}
  for pc, u in enumerate(lin):
    if u.op is Ops.RANGE: opened[u] = pc
    elif u.op is Ops.END:
      r = u.src[1] if len(u.src) == 2 else None
      if r not in opened: raise InterpretError(f"END at statement {pc} closes a loop that is not open (one END per RANGE)")
      start = opened.pop(r)
      jumps[start], jumps[pc] = pc, start
  if opened: raise InterpretError(f"RANGE {next(iter(opened)).arg.idx} is never closed by an END")
  return jumps


def _element(mem, i: int):
  if not 0 <= i < len(mem): raise InterpretError(f"load of element {i} of memory with {len(mem)} elements")
  if (v := mem[i]) is None: raise InterpretError(f"load of element {i} of an accumulator before anything was stored in it")
  return v


def _load(val: dict, u: UOp, memory: dict):
  mem, i = val[u.src[0]]
  if u.src[0].arg is None: return _element(mem, i)
  return tuple(_element(mem, i + k) for k in range(u.dtype.count))     # a vector of consecutive elements


def _store(val: dict, u: UOp, memory: dict) -> None:
  (mem, i), v = val[u.src[0]], val[u.src[1]]
  for k, x in enumerate(v if u.src[0].arg is not None else (v,)):
    if not 0 <= i + k < len(mem): raise InterpretError(f"store to element {i + k} of memory with {len(mem)} elements")
    mem[i + k] = x


def _buffer(val: dict, u: UOp, memory: dict) -> MutableSequence:
  if u.arg.slot not in memory: raise InterpretError(f"no memory for BUFFER slot {u.arg.slot}")
  return memory[u.arg.slot]


def _scalar_alu(op: Ops, dtype, args: list):
  if op is Ops.CAST: return cast_value(args[0], dtype)
  if op in (Ops.FLOORDIV, Ops.FLOORMOD) and args[1] == 0: return 0    # the compiled code's x // 0 == x % 0 == 0
  return exec_alu(op, dtype, *args)


def _alu(val: dict, u: UOp, memory: dict):
  args = [val[s] for s in u.src]
  if u.src[0].dtype.count == 1: return _scalar_alu(u.op, u.dtype, args)
  return tuple(_scalar_alu(u.op, u.dtype.scalar(), list(lanes)) for lanes in zip(*args))    # on vectors, lane by lane


# the value of each statement but a loop's RANGE and END (which move the program counter: see run_linear), from the
# values computed so far (`val`) and the buffers (`memory`); None for an effect
STATEMENTS: dict[Ops, Callable[[dict, UOp, dict], object]] = {
  Ops.CONST: lambda val, u, memory: u.arg,
  Ops.BUFFER: _buffer,
  Ops.ALLOC: lambda val, u, memory: [None] * u.arg.shape[0],      # fresh storage each time it is reached
  Ops.AFTER: lambda val, u, memory: val[u.src[0]],
  Ops.INDEX: lambda val, u, memory: (val[u.src[0]], val[u.src[1]]),
  Ops.LOAD: _load,
  Ops.STORE: _store,
  Ops.SINK: lambda val, u, memory: None,
  Ops.BARRIER: lambda val, u, memory: None,                       # one thread at a time: nothing to wait for
  Ops.VECTORIZE: lambda val, u, memory: tuple(val[s] for s in u.src),
  Ops.GEP: lambda val, u, memory: val[u.src[0]][u.arg],
  **dict.fromkeys(ALU, _alu),
}


def run_linear(lin: list[UOp], memory: dict[int, MutableSequence]) -> None:
  """Run the linearized program `lin` on `memory` ({BUFFER slot: values}), in place."""
  if not isinstance(lin, (list, tuple)) or not all(isinstance(u, UOp) for u in lin):
    raise InterpretError(f"run_linear takes the list of UOps linearize returns, got {type(lin).__name__}")
  if not isinstance(memory, dict): raise InterpretError(f"run_linear takes memory as {{slot: values}}, got {type(memory).__name__}")
  jumps = loop_jumps(lin)
  val: dict[UOp, object] = {}
  pc, n = 0, len(lin)
  while pc < n:
    u = lin[pc]
    op = u.op
    if op is Ops.RANGE:
      if val[u.src[0]] <= 0: pc = jumps[pc] + 1; continue     # an empty loop: past its END
      val[u] = 0
    elif op is Ops.END:
      r = lin[jumps[pc]]
      val[r] += 1
      if val[r] < val[r.src[0]]: pc = jumps[pc] + 1; continue   # the next iteration: back to the top of the body
    elif (statement := STATEMENTS.get(op)) is not None: val[u] = statement(val, u, memory)
    else: raise InterpretError(f"statement {pc} is a {op!r}, which the interpreter has no rule for (is the program lowered?)")
    pc += 1


__all__ = ["run_linear", "loop_jumps", "InterpretError", "STATEMENTS"]
