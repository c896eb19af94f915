"""Backends: where lowered programs become machine code and run.

A backend has a name and five verbs: `render(linear_program, name) -> source`, `compile(source) -> program`
(cached), `alloc(n, dtype)` and `copyin`/`copyout` between its buffers and NumPy arrays, and
`launch(program, buffers)`. The C backend (gcc, OpenMP) is the default and needs nothing but gcc. Backends
are found by name: the built-in ones, and any that another distribution registers under the entry point
group "uopc.backends" (`get_backend("C")`, or UOPC_DEVICE=... at the API boundary).

This module also holds what every backend must check before native code sees a program (DESIGN 5.3): each
LOAD and STORE index is proven in range from the symbolic bounds, or the kernel is refused with an error
naming the buffer, the index and its bounds. Division by zero needs no proof: the renderers emit C's / and %
only where bounds show a positive divisor and a non-negative dividend, and otherwise call helpers that give
NumPy's answer (x // 0 == x % 0 == 0) instead of trapping.
"""
from __future__ import annotations
import importlib.metadata
from typing import Any, Protocol
from uopc.uop import UOp, Ops
from uopc.dtype import AddrSpace
from uopc.symbolic import bounds


class BackendError(Exception):
  """An unknown backend, or a program a backend refuses before running it."""


class UnsafeKernelError(BackendError):
  """A LOAD or STORE whose index can't be proven inside its buffer."""


class Backend(Protocol):
  name: str
  def render(self, linear_program: list[UOp], name: str) -> str: ...
  def compile(self, src: str) -> Any: ...
  def alloc(self, n: int, dtype) -> Any: ...
  def copyin(self, buf: Any, arr) -> None: ...
  def copyout(self, buf: Any): ...
  def launch(self, program: Any, buffers: list[Any], launch_dims: Any = None) -> None: ...


def _builtin() -> dict[str, str]:
  return {"C": "uopc.backends.c:CBackend"}


def available_backends() -> list[str]:
  names = set(_builtin())
  try: names.update(ep.name for ep in importlib.metadata.entry_points(group="uopc.backends"))
  except Exception: pass   # a broken third-party installation must not hide the built-in backends
  return sorted(names)


_instances: dict[str, Backend] = {}

def get_backend(name: str = "C") -> Backend:
  """The backend called `name` (case-insensitive): built in, or registered under the entry point group uopc.backends."""
  key = str(name).upper()
  if key in _instances: return _instances[key]
  target = _builtin().get(key)
  if target is None:
    try: eps = {ep.name.upper(): ep for ep in importlib.metadata.entry_points(group="uopc.backends")}
    except Exception: eps = {}
    if key not in eps: raise BackendError(f"unknown backend {name!r}; available: {', '.join(available_backends())}")
    cls = eps[key].load()
  else:
    mod, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(mod), attr)
  _instances[key] = backend = cls()
  return backend


def base_memory(u: UOp) -> UOp:
  """The BUFFER or ALLOC behind a chain of AFTERs."""
  while u.op is Ops.AFTER: u = u.src[0]
  return u


def memory_name(m: UOp) -> str:
  return f"data{m.arg.slot}" if m.op is Ops.BUFFER else f"acc{m.arg.slot}"


def check_memory_safety(program: UOp | list[UOp]) -> None:
  """Refuse a kernel with a LOAD or STORE whose index bounds aren't inside its buffer (DESIGN 5.3)."""
  nodes = program.toposort() if isinstance(program, UOp) else program
  for u in nodes:
    if u.op is not Ops.INDEX or u.src[0].addrspace is AddrSpace.ALU: continue   # a shaped INDEX, not an address
    mem = base_memory(u.src[0])
    if len(u.src) != 2: raise UnsafeKernelError(f"{memory_name(mem)}: a memory INDEX takes one flat index, got {len(u.src) - 1}")
    n = mem.shape[0]
    lo, hi = bounds(u.src[1])
    if lo < 0 or hi >= n:
      from uopc.uir import to_uir
      expr = to_uir(u.src[1]).strip().replace("\n", "; ")
      raise UnsafeKernelError(f"{memory_name(mem)} has {n} elements but the index can be {lo}..{hi}, "
                              f"outside 0..{n - 1}: {expr if len(expr) < 400 else expr[:400] + ' ...'}")


def run_on(backend: Backend, sink: UOp, buffers: dict, name: str = "kernel") -> None:
  """Run a lowered program on any backend through its five verbs: the NumPy arrays in `buffers` (by slot) are copied
  in, the kernel launched, and every array copied back out (so outputs land in them, as with run_c)."""
  import numpy as np
  from uopc.linearize import linearize
  from uopc.backends.c import check_buffers, kernel_buffers
  arrays = check_buffers(sink, buffers)
  prog = backend.compile(backend.render(linearize(sink), name))
  devbufs = []
  for b, a in zip(kernel_buffers(sink), arrays):
    d = backend.alloc(b.shape[0], b.dtype)
    backend.copyin(d, a[:b.shape[0]])
    devbufs.append(d)
  backend.launch(prog, devbufs)
  for d, a, b in zip(devbufs, arrays, kernel_buffers(sink)): a[:b.shape[0]] = np.asarray(backend.copyout(d)).reshape(-1)


__all__ = ["run_on", "Backend", "BackendError", "UnsafeKernelError", "get_backend", "available_backends", "check_memory_safety",
           "base_memory", "memory_name"]
