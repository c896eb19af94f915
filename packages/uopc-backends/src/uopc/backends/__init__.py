"""Backends: where linearized programs become machine code and run. This docstring is the backend contract.

A backend is an object with a name, a renderer, the capabilities uopc.opt reads, and six verbs:

    name                          "C", "CUDA", "PYTHON", ...: how users pick it (get_backend, UOPC_DEVICE, device=)
    renderer                      turns a LinearProgram into source text: render(program) -> str. None for a backend
                                  that runs the linearized program itself (an interpreter, an emulator)
    caps                          a uopc.opt.Caps: threads, vector width, caches, GPU or not
    compile(src, name)            the rendered source (or, with no renderer, the LinearProgram itself) -> a handle the
                                  backend can launch; `name` is the function the source defines. Caching on disk is
                                  the backend's business
    alloc(n, dtype)               memory for n elements of dtype -> a handle
    copyin(handle, array)         fill it from a flat, C-contiguous NumPy array of exactly its dtype and size
    copyout(handle)               -> a flat NumPy array: a copy of its contents
    launch(program, handles, global_size=None, local_size=None)
                                  run a compiled program on memory handles given in the program's parameter order
                                  (LinearProgram.params); GPU backends get the grid and block sizes
    synchronize()                 return when everything launched so far has finished
    free(handle)                  optional: the memory of a handle nothing uses any more (its Buffer died), for the
                                  backend to reuse. What alloc hands out holds anything: every kernel writes all of
                                  its output
    compile_many(items)           optional: compile(src, name) for each (src, name) of a list, in one go where that is
                                  cheaper (the C backend: one gcc run); uopc.runtime.compile_kernels hands it batches

Nothing else may be assumed: uopc.runtime is the only caller of these verbs, and it does everything that is the
same for all backends (choosing Opts, lowering, linearizing, the memory-safety proof below, the program cache,
checking every launch's buffers, profiling). A backend never sees a program the proof refused (making a LinearProgram
runs it), and it never gets a parameter list that disagrees with the program it compiled: both come from the one
LinearProgram.

Backends are found by name: the built-in ones (C; CUDA, uopc.backends.cuda; PYTHON, the NumPy GPU emulator of
uopc.backends.python), those registered in-process with `register_backend(name, factory)`, and those another
distribution declares under the entry point group "uopc.backends".

The launch grid of a GPU program: global_size and local_size are the sizes of its GLOBAL and LOCAL ranges, in range
order. A launch runs prod(global_size) blocks of prod(local_size) threads, numbered flat (CUDA: blockIdx.x and
threadIdx.x), and each range's coordinate is a digit of that number, the first range the most significant: range k is
(flat // prod(sizes[k+1:])) % sizes[k]. So the last LOCAL range moves fastest from thread to thread, and a warp is 32
consecutive threads. Renderers and emulators compute the coordinates the same way, from this paragraph.

The memory-safety proof: each LOAD and STORE index is proven in range from the symbolic bounds, or the
kernel is refused with an error naming the memory, the index and its bounds. It covers every address space: GLOBAL
BUFFERs, and ALLOCs in LOCAL memory (a thread's accumulators and registers) and SHARED memory (a GPU block's), on CPU
and GPU programs alike; a LOAD or STORE reaches memory only through an INDEX of one element, or of a vector's n
consecutive elements (uopc.vectorize), every one of which is proven inside, and an element of a register array (a
STACK, a WMMA fragment) is indexed inside it too. It runs where a LinearProgram is made, so no
renderer or backend can be handed a program it refused, whichever road built it. Division by zero needs no proof: the
renderers emit C's / and % only where bounds show a positive divisor and a non-negative dividend, and otherwise
call helpers that give NumPy's answer (x // 0 == x % 0 == 0) instead of trapping.
"""
from __future__ import annotations
import importlib, importlib.metadata, math, os, threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol
from uopc.uop import UOp, Ops
from uopc.dtype import AddrSpace, DType
from uopc.symbolic import bounds
from uopc.uir import to_uir


class BackendError(Exception):
  """An unknown backend, or a program or buffer a backend refuses before running it."""


class CompileError(BackendError):
  """A backend's compiler (gcc, nvcc, NVRTC) refused a kernel; the message has the compiler's output and the numbered
  source."""


class UnsafeKernelError(BackendError):
  """A LOAD or STORE whose index can't be proven inside its buffer."""


def sanitizing() -> bool:
  """Is UOPC_SANITIZE set (read at each use, like UOPC_CACHE_DIR)? The C backend then builds its kernels with
  AddressSanitizer, and whatever shares memory between buffers (uopc.memory) shares it only where that stays visible."""
  return os.environ.get("UOPC_SANITIZE", "").strip() not in ("", "0")


@dataclass(frozen=True)
class LinearProgram:
  """What a renderer (or a backend without one) is given: the function's name, the linearized statements, and its
  parameters: the BUFFERs in launch order. A parameter the statements never mention (an input that lowering found
  unread) is still a parameter, so the compiled signature and the launch arguments can't drift apart."""
  name: str
  uops: tuple[UOp, ...]
  params: tuple[UOp, ...]

  def __post_init__(self): check_memory_safety(self.uops)   # every road to a renderer or a backend passes here


class Backend(Protocol):
  name: str
  renderer: Any
  caps: Any
  def compile(self, src: Any, name: str) -> Any: ...
  def alloc(self, n: int, dtype: DType) -> Any: ...
  def copyin(self, handle: Any, array) -> None: ...
  def copyout(self, handle: Any): ...
  def launch(self, program: Any, handles: list[Any], global_size: tuple[int, ...] | None = None,
             local_size: tuple[int, ...] | None = None) -> None: ...
  def synchronize(self) -> None: ...
  # optional: graph(launches, slots) -> a callable taking one handle per slot that runs launches [(program, slots of
  # its arguments, global size, local size), ...] in order as one native call (uopc.runtime.LaunchGraph uses it)


_BUILTIN: dict[str, str] = {"C": "uopc.backends.c:CBackend", "PYTHON": "uopc.backends.python:PythonBackend",
                            "CUDA": "uopc.backends.cuda:CUDABackend"}
_registered: dict[str, Callable[[], Backend]] = {}
_instances: dict[str, Backend] = {}
# a backend is a singleton per name: memory made on one instance is refused by a program compiled on another ("lives on
# backend C, the program runs on C"), and threads asking at once each built their own. Reentrant, so that a factory
# may itself ask for another backend.
_registry_lock = threading.RLock()


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
  """Make `factory()` the backend called `name` (case-insensitive) in this process, replacing one of that name."""
  if not isinstance(name, str) or not name.strip(): raise BackendError(f"a backend needs a non-empty name, got {name!r}")
  if not callable(factory): raise BackendError(f"register_backend({name!r}, ...) needs a factory (a class or a function), got {factory!r}")
  key = name.strip().upper()
  with _registry_lock:
    _registered[key] = factory
    _instances.pop(key, None)


def _entry_points() -> dict[str, Any]:
  try: return {ep.name.upper(): ep for ep in importlib.metadata.entry_points(group="uopc.backends")}
  except Exception: return {}   # a broken third-party installation must not hide the built-in backends


def available_backends() -> list[str]:
  names = {n.upper(): n for n in _BUILTIN}
  for key, ep in _entry_points().items(): names.setdefault(key, ep.name)
  names.update({k: k for k in _registered})
  return sorted(names.values())


def get_backend(name: str | None = "C") -> Backend:
  """The backend called `name` (case-insensitive; None or "" is the default, C): registered in this process, built in,
  or declared under the entry point group uopc.backends. One instance per name in the process, made once even when
  threads ask at the same time."""
  key = str(name or "C").strip().upper() or "C"
  if (b := _instances.get(key)) is not None: return b
  with _registry_lock:
    if (b := _instances.get(key)) is not None: return b   # another thread made it while this one waited for the lock
    if key in _registered: factory = _registered[key]
    elif key in _BUILTIN:
      mod, _, attr = _BUILTIN[key].partition(":")
      factory = getattr(importlib.import_module(mod), attr)
    elif key in (eps := _entry_points()): factory = eps[key].load()
    else: raise BackendError(f"unknown backend {name!r}; available: {', '.join(available_backends())}")
    try: backend = factory()
    except BackendError: raise
    except Exception as e: raise BackendError(f"backend {key}: its factory failed: {type(e).__name__}: {e}") from e
    _instances[key] = backend
    return backend


# ---- what every backend relies on -----------------------------------------------------------------------------------

def base_memory(u: UOp) -> UOp:
  """The BUFFER or ALLOC behind a chain of AFTERs."""
  while u.op is Ops.AFTER: u = u.src[0]
  return u


def memory_name(m: UOp) -> str:
  return f"data{m.arg.slot}" if m.op is Ops.BUFFER else f"acc{m.arg.slot}"


def _where(m: UOp) -> str:
  """The memory's name with its address space, for the proof's messages: data0, acc1 (local), acc2 (shared)."""
  if m.op is Ops.BUFFER: return memory_name(m)
  return f"{memory_name(m)} ({m.addrspace.name.lower()})" if m.op is Ops.ALLOC else f"a {m.op.name} of {m.addrspace.name} memory"


def _shown(index: UOp) -> str:
  expr = to_uir(index).strip().replace("\n", "; ")
  return expr if len(expr) < 400 else expr[:400] + " ..."


def check_memory_safety(program: UOp | list[UOp] | tuple[UOp, ...]) -> None:
  """Refuse a program with a memory access not proven inside its memory, in every address space: each
  INDEX of a BUFFER or ALLOC (LOCAL or SHARED) takes one flat index whose bounds lie in the memory (for a vector INDEX,
  the index of its first element: all n of them lie in it); each LOAD and STORE goes through such an INDEX and moves
  its element (or vector); an INDEX of a register array (a STACK, WMMA's fragments) stays inside its shape."""
  nodes = program.toposort() if isinstance(program, UOp) else program
  for u in nodes:
    op = u.op
    if op is Ops.LOAD or op is Ops.STORE:
      ptr = u.src[0]
      if ptr.op is not Ops.INDEX or ptr.src[0].addrspace is AddrSpace.ALU:
        raise UnsafeKernelError(f"a {op.name} reaches memory only through an INDEX of one element, got a {op.name} of {ptr.op.name} "
                                f"({ptr.addrspace.name} {ptr.dtype.name}{list(ptr.shape)})")
      if op is Ops.STORE and u.src[1].shape != ():
        raise UnsafeKernelError(f"{_where(base_memory(ptr.src[0]))}: a STORE writes one element, got a value of shape {u.src[1].shape} "
                                f"({math.prod(u.src[1].shape)} elements) at {_shown(ptr.src[1]) if len(ptr.src) > 1 else 'no index'}")
    elif op is Ops.INDEX:
      x = u.src[0]
      if x.addrspace is AddrSpace.ALU:      # an element of a register array: each index inside its axis
        for axis, (i, n) in enumerate(zip(u.src[1:], x.shape)):
          lo, hi = bounds(i)
          if lo < 0 or hi >= n:
            raise UnsafeKernelError(f"a {x.op.name} of shape {x.shape} is indexed on axis {axis} at {lo}..{hi}, outside 0..{n - 1}: {_shown(i)}")
        continue
      mem = base_memory(x)
      if mem.op not in (Ops.BUFFER, Ops.ALLOC):
        raise UnsafeKernelError(f"{_where(mem)} is indexed: an address is an INDEX of a BUFFER or an ALLOC (behind AFTERs)")
      if len(u.src) != 2: raise UnsafeKernelError(f"{_where(mem)}: a memory INDEX takes one flat index, got {len(u.src) - 1}")
      n = mem.shape[0]
      lo, hi = bounds(u.src[1])
      lanes = u.dtype.count if u.arg is not None else 1     # a vector INDEX reaches this many elements from its index on
      if lo < 0 or hi + lanes - 1 >= n:
        what = f"the index can be {lo}..{hi}" + (f" and a {u.dtype.name} reaches {lanes - 1} elements past it" if lanes > 1 else "")
        raise UnsafeKernelError(f"{_where(mem)} has {n} elements but {what}, outside 0..{n - 1}: {_shown(u.src[1])}")


__all__ = ["Backend", "BackendError", "CompileError", "UnsafeKernelError", "LinearProgram", "get_backend", "register_backend",
           "available_backends", "check_memory_safety", "base_memory", "memory_name", "sanitizing"]
