"""uopc.runtime: the one road from a kernel to a running program.

    compile_kernel(kernel, backend, opts=None) -> Program    choose Opts, lower, vectorize, linearize, prove safe, render, compile
    compile_program(sink, backend, name) -> Program          the same road for a SINK that is already lowered
    program(buffers)                                         launch it on Buffers, each checked against its parameter
    run_schedule(kernels, backend, buffers)                  a schedule's kernels in order, allocating their outputs (a
                                                             Schedule from kernelize_cached: one launch graph per Plan)
    LaunchGraph(launches)(table)                             launches that always run together (a JIT's replay), one
                                                             native call on a backend with `graph` (the C backend)
    Buffer(backend, n, dtype)                                memory a backend owns: filled from NumPy, read by .numpy()

Everything that runs a kernel goes through here: Tensor.realize, the JIT (which records the (Program, Buffers)
launches that run_schedule makes and replays them), uopc.testing's run_shaped, run_c and run_on, the `uopc` command
and the benchmarks. What is the same for every backend lives here once, so no backend can forget it:

  * Opts: a kernel compiled without them gets the choice of an OptsPolicy, passed in as `policy`: by default the
    choice a timed search stored for the kernel on this backend (store_opts), else uopc.opt's heuristics; uopc.search's
    Search policy times candidates first. Every Opts is validated against the kernel and the backend (GPU Opts on a
    CPU backend are an error, as is any entry lower() would have to ignore);
  * the memory-safety proof (uopc.backends.check_memory_safety, run by every LinearProgram) on every program, before
    it is rendered, on each road here: compile_kernel, compile_kernels and run_schedule, compile_program and run_lowered;
  * one parameter list: a Program's parameters (slot, dtype, element count) are fixed when it is compiled, from the
    same LinearProgram the renderer turns into the signature. A kernel's parameters are all its buffers, in canonical
    order, even an input that lowering found unread (`Tensor.zeros(4, 0).sum(1)` reads nothing), so the arguments of
    a launch can't shift; a launch passes exactly those Buffers, and each one's backend, dtype and size is checked
    before native code runs;
  * the program cache: in-process by (backend, canonical kernel, Opts or policy), so each kernel structure compiles once per
    process while it is among the most recently used (`_programs.limit` entries; an evicted one is compiled again when
    it comes back); across processes the backend's compiler caches on disk, and so does this module the rendered
    source of each kernel (a plan: see _plan_path), so a new process neither lowers nor renders a kernel it has seen;
  * profiling (the tally is uopc.profiling's), in the convention tinygrad and PyTorch users know: UOPC_DEBUG=1 prints
    a line per launch to stderr (program, output shape, time, GFLOP/s and GB/s, with FLOPs and bytes counted once per
    program), =2 also each program's source when it is first compiled, =3 also its linearized UOps; any level prints a
    summary at exit.
"""
from __future__ import annotations
import functools, hashlib, json, marshal, os, sys, threading, time, warnings
from collections import OrderedDict, abc
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import ExitStack
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, MutableMapping, Sequence
import numpy as np
from uopc.dtype import DType, dtypes
from uopc.uop import UOp, Ops, AxisType, prod
from uopc.uir import to_uir
from uopc.lowering import Opts, Ctx, LowerError
from uopc.rangeify import lower
from uopc.linearize import linearize
from uopc.vectorize import vectorize
from uopc.kernelize import Kernel, Schedule
from uopc.opt import Caps, choose_opts
from uopc.gpulower import block_threads
from uopc.compile_cache import cache_dir, read_entry, write_entry
from uopc.backends import Backend, BackendError, LinearProgram, base_memory
from uopc.memory import schedule_temporaries
from uopc.profiling import _Profile, profile, launch_cost, launch_grid, format_linear   # noqa: F401  (runtime.profile is the one tests swap)


def np_dtype(dtype: DType) -> np.dtype:
  """The NumPy dtype that holds values of `dtype`."""
  if dtype.fmt is None: raise BackendError(f"no NumPy dtype for {dtype}")
  return np.dtype(dtype.fmt)


def debug_level() -> int:
  """UOPC_DEBUG as a number (0 when unset or empty); read where a program is compiled or launched."""
  v = os.environ.get("UOPC_DEBUG", "").strip()
  if not v: return 0
  try: return int(v)
  except ValueError:
    warnings.warn(f"UOPC_DEBUG={v!r} is not a number (0 = quiet, 1 = a line per kernel, 2 = + source, 3 = + UOps); using 0", stacklevel=3)
    os.environ["UOPC_DEBUG"] = "0"
    return 0


# ---- memory ------------------------------------------------------------------------------------------------------

class Buffer:
  """`size` elements of `dtype` in memory owned by `backend` (its alloc's handle). Data crosses to and from NumPy only
  through copyin and numpy(). `version` counts the times the buffer was written after the first: copyin raises it, and
  so does whoever writes a buffer again with kernels (uopc.jit's replays), so that a cache of what was computed from
  a buffer can tell whether it still holds those values. `owner`: the Buffer whose memory an alias() names (None: its own)."""
  __slots__ = ("backend", "size", "dtype", "handle", "version", "owner", "__weakref__")

  def __init__(self, backend: Backend, size: int, dtype: DType):
    self.owner = None
    if type(size) is not int or size < 0: raise BackendError(f"a Buffer holds a non-negative number of elements, got {size!r}")
    if not isinstance(dtype, DType): raise BackendError(f"a Buffer's dtype is a uopc DType, got {dtype!r}")
    if not callable(getattr(backend, "alloc", None)): raise BackendError(f"a Buffer lives on a backend (uopc.backends.get_backend), got {backend!r}")
    np_dtype(dtype)
    self.backend, self.size, self.dtype, self.version = backend, size, dtype, 0
    try: self.handle = backend.alloc(size, dtype)
    except MemoryError: raise BackendError(f"out of memory: a {dtype.name} buffer of {size} elements ({size * dtype.itemsize / 2**30:.1f} GiB) "
                                           f"on backend {backend.name}") from None

  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize

  def alias(self, size: int | None = None) -> Buffer:
    """Another Buffer over this one's memory (which it keeps alive), of its first `size` elements (all by default): the
    same bytes under an identity of its own, as uopc.jit's capture needs each temporary of a run to have (uopc.memory
    may have put several in one memory)."""
    if size is not None and (type(size) is not int or not 0 <= size <= self.size):
      raise BackendError(f"an alias of {self} can't hold {size!r} elements")
    b = object.__new__(Buffer)
    b.backend, b.size, b.dtype, b.handle, b.version, b.owner = self.backend, self.size if size is None else size, self.dtype, self.handle, 0, self
    return b

  def __del__(self):
    # the backend may reuse the memory (fresh memory costs a page fault per 4 KiB on its first write: 0.3 ms per MiB)
    try:
      if self.owner is None and (free := getattr(self.backend, "free", None)) is not None: free(self.handle)
    except Exception: pass   # at interpreter exit the backend may already be gone

  def copyin(self, data) -> Buffer:
    """Fill the buffer from array-like `data` with exactly `size` elements (converted to the buffer's dtype)."""
    arr = np.asarray(data)
    if arr.size != self.size: raise BackendError(f"copyin: {arr.size} values into a {self.dtype.name} buffer of {self.size}")
    try: flat = np.ascontiguousarray(arr.reshape(-1), dtype=np_dtype(self.dtype))
    except (ValueError, TypeError) as e: raise BackendError(f"copyin: {arr.dtype} values can't go into a {self.dtype.name} buffer ({e})") from None
    self.backend.copyin(self.handle, flat)
    self.version += 1
    return self

  def numpy(self) -> np.ndarray:
    """A flat NumPy copy of the buffer's contents."""
    arr = np.asarray(self.backend.copyout(self.handle)).reshape(-1)
    if arr.size != self.size or arr.dtype != np_dtype(self.dtype):
      raise BackendError(f"backend {self.backend.name}: copyout gave {arr.dtype}[{arr.size}] for a {self.dtype.name} buffer of {self.size}")
    return arr

  @staticmethod
  def from_numpy(data, backend: Backend, dtype: DType | None = None) -> Buffer:
    arr = np.asarray(data)
    if dtype is None:
      dtype = next((d for d in dtypes.all if d.fmt is not None and np.dtype(d.fmt) == arr.dtype), None)
      if dtype is None: raise BackendError(f"no uopc dtype holds NumPy {arr.dtype} values")
    return Buffer(backend, arr.size, dtype).copyin(arr)

  def __repr__(self): return f"<Buffer {self.dtype.name}[{self.size}] on {self.backend.name}>"


# ---- programs ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
  """One parameter of a compiled program: the BUFFER slot, its dtype, how many elements it needs, and whether the
  program writes it."""
  slot: int
  dtype: DType
  size: int
  written: bool


class Program:
  """A compiled kernel. `src` is the rendered source (None for a backend that renders none); `params` are fixed at
  compile time; calling it launches it on a list of Buffers, one per parameter, in order."""
  __slots__ = ("name", "src", "opts", "params", "backend", "handle", "global_size", "local_size", "shape", "flops", "nbytes", "uops")

  def __init__(self, name: str, src: str | None, opts: Opts | None, params: tuple[Param, ...], backend: Backend, handle: Any,
               global_size: tuple[int, ...] | None, local_size: tuple[int, ...] | None, shape: tuple[int, ...], flops: int, nbytes: int,
               uops: tuple[UOp, ...]):
    self.name, self.src, self.opts, self.params, self.backend, self.handle = name, src, opts, params, backend, handle
    self.global_size, self.local_size, self.shape, self.flops, self.nbytes, self.uops = global_size, local_size, shape, flops, nbytes, uops

  def __repr__(self): return f"<Program {self.name} on {self.backend.name}: {len(self.params)} params>"

  def check(self, buffers: Sequence[Buffer]) -> None:
    """Refuse buffers that don't match the parameters: their number, backend, dtype or size, or a written one passed twice."""
    if not isinstance(buffers, (list, tuple)): raise BackendError(f"{self.name}: is launched on a list of Buffers, got {type(buffers).__name__}")
    if len(buffers) != len(self.params):
      want = ", ".join(f"data{p.slot} {p.dtype.name}[{p.size}]" for p in self.params)
      raise BackendError(f"{self.name}: takes {len(self.params)} buffers ({want}), got {len(buffers)}")
    for i, (p, b) in enumerate(zip(self.params, buffers)):
      if not isinstance(b, Buffer): raise BackendError(f"{self.name}: argument {i} (data{p.slot}) must be a Buffer, got {type(b).__name__}")
      if b.backend is not self.backend:
        raise BackendError(f"{self.name}: argument {i} (data{p.slot}) lives on backend {b.backend.name}, the program runs on {self.backend.name}")
      if b.dtype is not p.dtype or b.size < p.size:
        raise BackendError(f"{self.name}: argument {i} (data{p.slot}) must be {p.dtype.name}[{p.size}], got a buffer {b.dtype.name}[{b.size}]")
      if p.written and any(o is b for j, o in enumerate(buffers) if j != i):
        raise BackendError(f"{self.name}: argument {i} (data{p.slot}) is written and also passed as another argument (its pointers are restrict)")

  def __call__(self, buffers: Sequence[Buffer]) -> None:
    """Launch on `buffers` (checked first). With UOPC_DEBUG set, wait for it and report its time."""
    self.check(buffers)
    handles = [b.handle for b in buffers]
    if not debug_level():
      self.backend.launch(self.handle, handles, self.global_size, self.local_size)
      return
    self.backend.synchronize()
    start = time.perf_counter()
    self.backend.launch(self.handle, handles, self.global_size, self.local_size)
    self.backend.synchronize()
    profile.launched(self, time.perf_counter() - start)


class ProgramCache:
  """The in-process program cache: key -> Program, at most `limit` entries, the least recently used evicted first. A
  cache that never evicts grew by about 26 KB per distinct kernel (the key holds the kernel's graph), so a process that
  meets ever new shapes grew without end. An evicted Program stays valid for whoever holds it (a jit replay); asked for
  again, it is compiled again (from the backend's disk cache: no C compiler runs). Safe to share between threads. It
  also keeps the launch graphs run_schedule makes of planned schedules (`graphs`, see _run_planned): they hold Programs
  too, so clear() forgets them with the rest."""
  def __init__(self, limit: int):
    self.limit = limit
    self._entries: OrderedDict[tuple, Program] = OrderedDict()
    self._lock = threading.Lock()
    self.graphs: OrderedDict[tuple, tuple[LaunchGraph, threading.Lock]] = OrderedDict()

  def get(self, key: tuple, default: Program | None = None) -> Program | None:
    with self._lock:
      prog = self._entries.get(key)
      if prog is None: return default
      self._entries.move_to_end(key)
      return prog

  def __setitem__(self, key: tuple, prog: Program) -> None:
    with self._lock:
      self._entries[key] = prog
      self._entries.move_to_end(key)
      while len(self._entries) > self.limit: self._entries.popitem(last=False)

  def __contains__(self, key: tuple) -> bool: return key in self._entries
  def __len__(self) -> int: return len(self._entries)

  def clear(self) -> None:
    with self._lock:
      self._entries.clear()
      self.graphs.clear()


# (backend, canonical kernel or lowered SINK, its parameters, Opts or the policy that chose them, name) -> Program. A kernel
# compiled with the Opts chosen for it has two keys (as asked, by its policy, and as chosen), so 2048 entries hold at least
# 1024 programs.
_programs = ProgramCache(2048)


def kernel_name(kernel: Kernel) -> str:
  """A name that says what the kernel computes, tinygrad-style: E_ (elementwise) or r_ (it reduces), then the output
  shape, then for a reduction the reduced sizes: r_16_64__128 reduces 128 elements into each of 16x64 outputs."""
  reduced = [u.src[0].shape[len(u.src[0].shape) - u.arg[1]:] for u in kernel.canonical_root.toposort() if u.op is Ops.REDUCE]
  name = ("r_" if reduced else "E_") + ("_".join(map(str, kernel.root.shape)) or "1")
  if reduced: name += "__" + "_".join(map(str, max(reduced, key=prod)))
  return name


# ---- choosing Opts --------------------------------------------------------------------------------------------------

def backend_caps(backend: Backend) -> Caps:
  """What `backend` tells uopc.opt about its machine (a backend without `caps` gets the plain Caps())."""
  return getattr(backend, "caps", None) or Caps()


class OptsPolicy:
  """How the runtime chooses Opts for a kernel compiled without them: compile_kernel, compile_kernels and run_schedule
  take one as `policy`. This one, the default, takes the choice a timed search stored for the kernel on this backend
  (stored_opts), else uopc.opt's heuristics, and never times anything. A policy that `measures` (uopc.search.Search)
  gets each kernel's real input Buffers from run_schedule before the kernel first runs in the process (first_run),
  and run_schedule then compiles one kernel at a time, so that each is compiled with what was measured."""
  measures = False

  def choose(self, kernel: Kernel, backend: Backend) -> Opts:
    return stored_opts(kernel, backend) or choose_opts(kernel, backend_caps(backend))

  def first_run(self, kernel: Kernel, backend: Backend, inputs: list[Buffer]) -> None:
    """Called by run_schedule, for a policy that measures, before `kernel` first runs under it in this process."""


DEFAULT_POLICY = OptsPolicy()


# The Opts a search chose, on disk under $UOPC_CACHE_DIR/opts: one uopc.compile_cache entry (JSON, sealed) per canonical
# kernel, backend, capabilities and compiler, so a choice is used only where it was measured.

@functools.lru_cache(maxsize=256)
def _kernel_text(root: UOp, out: UOp) -> str:
  """A canonical kernel as .uir text, what the files on disk are keyed by (a miss reads the Opts store and the plans:
  written once, not once for each)."""
  return to_uir(UOp(Ops.SINK, (root, out)))


def stored_opts_path(kernel: Kernel, backend: Backend) -> Path:
  ident = getattr(backend, "identity", None)   # the compiler and the target CPU, for a backend that has them
  key = repr((backend.name, getattr(backend, "caps", None), ident() if callable(ident) else None))
  text = _kernel_text(kernel.canonical_root, kernel.canonical_out)
  digest = hashlib.sha256(f"{text}\0{key}".encode()).hexdigest()
  return cache_dir() / "opts" / f"{digest[:32]}.json"


def stored_opts(kernel: Kernel, backend: Backend) -> Opts | None:
  """The Opts a search stored for this kernel on this backend, or None (no entry, or a damaged one)."""
  data = read_entry(stored_opts_path(kernel, backend))
  if data is None: return None
  try: return Opts.from_dict(json.loads(data)["opts"])
  except (ValueError, KeyError, TypeError, LowerError): return None


def store_opts(kernel: Kernel, backend: Backend, opts: Opts, **facts) -> None:
  """Store `opts` as the choice for this kernel on this backend, with `facts` about how it was found (JSON values). A
  cache that can't take it costs the next run a search, nothing else."""
  try: write_entry(stored_opts_path(kernel, backend), json.dumps({"opts": opts.to_dict(), **facts}).encode())
  except OSError: pass


def compile_kernel(kernel: Kernel, backend: Backend, opts: Opts | None = None, name: str | None = None,
                   policy: OptsPolicy = DEFAULT_POLICY) -> Program:
  """The Program that runs `kernel` on `backend`: Opts from `policy` when none are given, then lower, linearize, the
  memory-safety proof, render and compile. Cached in-process by (backend, canonical kernel, Opts). Its parameters are
  the kernel's buffers (Kernel.buffers' order); its name says what it computes unless `name` is given."""
  plan = _plan_kernel(kernel, backend, opts, name, policy)
  return plan if isinstance(plan, Program) else plan.finish(backend.compile(plan.compilable, plan.name))


def compile_kernels(kernels: Sequence[Kernel], backend: Backend, policy: OptsPolicy = DEFAULT_POLICY) -> list[Program]:
  """compile_kernel for each kernel (with the Opts `policy` chooses), the backend's compiles running side by side and
  beside the planning of the kernels after them: a C compile is a gcc process, which starts as soon as its kernel is
  rendered, while Python lowers the next (a cold GPT step planned every kernel, then waited for gcc: 6.6 s). A backend
  with compile_many (the C backend) gets the kernels in batches, one compiler run each: whatever was planned while the
  compiler was busy (up to BATCH_SOURCE of source; the thread whose run ended starts the next), and at the end what is
  left, in parts of equal source, one per CPU."""
  unique: dict[tuple, Program | _Pending] = {}            # a schedule repeats structures (every layer's GEMMs): plan each once
  compiled: list[tuple[_Pending, Any]] = []               # (plan, the backend's handle), appended as each compile ends
  done: dict[int, Program] = {}
  finished = 0                                             # how many of `compiled` made their Program
  many = getattr(backend, "compile_many", None)
  workers = _COMPILE_WORKERS
  waiting: list[_Pending] = []
  lock, state = threading.Lock(), {"planning": True, "feeding": 0}
  futures: list[Future] = []
  def build(group: list[_Pending]) -> None:
    hs = many([(p.compilable, p.name) for p in group]) if many is not None and len(group) > 1 else \
      [backend.compile(p.compilable, p.name) for p in group]
    compiled.extend(zip(group, hs))
  def finish_compiled() -> None:
    # each compiled plan made a Program (its facts counted, its plan written to the disk cache) as soon as the planner
    # or the wait at the end finds it compiled: all of them after the last compile was 60-90 ms of a cold GPT step
    nonlocal finished
    while finished < len(compiled):
      plan, handle = compiled[finished]
      finished += 1
      done[id(plan)] = plan.finish(handle)
  def feed(group: list[_Pending]) -> None:
    # a compiler run, then, while planning goes on, the next one of what was planned meanwhile, at once: waiting for the
    # planner to look (after the kernel it was lowering) left gcc idle 13-21 ms a run of a cold GPT step
    try:
      while group:
        build(group)
        with lock:
          at = _batch(waiting) if state["planning"] and waiting else 0
          group, waiting[:at] = waiting[:at], []
    finally:
      with lock: state["feeding"] -= 1
  with ExitStack() as stack:
    pool: ThreadPoolExecutor | None = None                  # made when a kernel needs a compile: most schedules have none new
    def submit(fn, group: list) -> None:
      nonlocal pool
      if pool is None: pool = stack.enter_context(ThreadPoolExecutor(workers + 1))   # (the last parts beside one still running)
      futures.append(pool.submit(fn, group))
    try:
      for k in kernels:
        if (k.canonical_root, k.canonical_out) in unique: continue
        plan = unique[(k.canonical_root, k.canonical_out)] = _plan_kernel(k, backend, None, None, policy)
        if isinstance(plan, Program): continue
        if many is None:
          submit(build, [plan])
          continue
        with lock:
          waiting.append(plan)
          group = []
          if state["feeding"] < workers - 1:     # one CPU plans (Python); the others compile what it has planned so far
            at = _batch(waiting)
            group, waiting[:at] = waiting[:at], []
            state["feeding"] += 1
        if group: submit(feed, group)
        finish_compiled()
    finally:
      with lock: state["planning"], rest, waiting[:] = False, list(waiting), []
    if rest:
      # what is left goes to every worker at once, in parts of about equal source (gcc's time grows with it), not only to
      # the idle ones: a compile still running ends soon, and a part that waited for it ran alone at the end (a cold GPT
      # step's last 80 kernels were one part, 4.3 s of gcc after planning, the other CPU idle)
      for part in _balanced(rest, min(len(rest), workers)): submit(build, part)
    # (an error planning a later kernel leaves the pool waiting for the compiles already started, then propagates)
    for f in as_completed(futures):
      f.result()
      finish_compiled()
  return [p if isinstance(p, Program) else done[id(p)] for p in (unique[(k.canonical_root, k.canonical_out)] for k in kernels)]


_COMPILE_WORKERS = max(2, os.cpu_count() or 1)   # compiles at once (os.cpu_count() costs 30 us a call here: read once)


# A compiler run's source while planning goes on: gcc takes 3-4 ms a KB of kernel source here, so about 0.2 s; a run
# also costs 30 ms before it compiles anything (a cold GPT step, alternating: 32 KB 1.14-1.32 s, 64 KB 1.00-1.14 s)
BATCH_SOURCE = 64_000


def _source_size(plan: _Pending) -> int:
  return len(plan.compilable) if isinstance(plan.compilable, (str, bytes)) else 1


def _batch(plans: list[_Pending]) -> int:
  """How many of `plans`, from the first, make one compiler run while planning goes on: at least one, and no more than
  BATCH_SOURCE characters of source, so that no long run is left alone when planning ends."""
  at, size = 0, 0
  while at < len(plans) and (at == 0 or size + _source_size(plans[at]) <= BATCH_SOURCE):
    size += _source_size(plans[at])
    at += 1
  return at


def _balanced(plans: list[_Pending], parts: int) -> list[list[_Pending]]:
  """`plans` in `parts` groups of about equal source length, largest first to the lightest group (each group keeps the
  plans' order)."""
  cost = [_source_size(p) for p in plans]
  load, groups = [0] * parts, [[] for _ in range(parts)]
  for i in sorted(range(len(plans)), key=lambda i: -cost[i]):
    g = load.index(min(load))
    load[g] += cost[i]
    groups[g].append(i)
  return [[plans[i] for i in sorted(g)] for g in groups if g]


def _plan_kernel(kernel: Kernel, backend: Backend, opts: Opts | None, name: str | None, policy: OptsPolicy) -> Program | _Pending:
  """The cached Program, or everything up to the backend's compile (done in Python), waiting for its handle."""
  if not isinstance(kernel, Kernel): raise BackendError(f"compile_kernel takes a uopc.kernelize.Kernel, got {type(kernel).__name__}")
  if not isinstance(policy, OptsPolicy): raise BackendError(f"compile_kernel: policy must be an OptsPolicy, got {type(policy).__name__}")
  # the policy's choice is cached with the program (under the policy): choosing lowers the kernel once to read it
  asked_key = (backend, kernel.canonical_root, kernel.canonical_out, opts if opts is not None else policy, name)
  if (prog := _programs.get(asked_key)) is not None: return prog
  disk = _plan_path(kernel, backend, opts, policy, name)
  # (UOPC_DEBUG=3 asks for the linearized UOps, which a plan doesn't hold: that lowers)
  if disk is not None and debug_level() < 3 and (plan := _read_plan(disk, kernel, backend, name, asked_key)) is not None: return plan
  caps = backend_caps(backend)
  if opts is None: chosen = policy.choose(kernel, backend)
  elif not isinstance(opts, Opts): raise LowerError(f"compile_kernel: opts must be an Opts, got {type(opts).__name__}")
  else: chosen = opts
  key = (backend, kernel.canonical_root, kernel.canonical_out, chosen, name)
  if (prog := _programs.get(key)) is not None:
    _programs[asked_key] = prog
    return prog
  if chosen.gpu and not caps.gpu:
    raise LowerError(f"Opts.gpu: backend {backend.name} is not a GPU; lower with gpu=False (kernel shape {kernel.root.shape})")
  if chosen.gpu and (threads := block_threads(chosen)) > caps.max_local:
    raise LowerError(f"Opts: {threads} threads per block, but backend {backend.name} runs at most {caps.max_local} "
                     f"(kernel shape {kernel.root.shape})")
  if chosen.tc and not caps.tensor_cores:
    raise LowerError(f"Opts.tc: backend {backend.name} has no tensor cores (kernel shape {kernel.root.shape})")
  start = time.perf_counter()
  sink = lower(kernel.canonical_root, kernel.canonical_out, Ctx(opts=chosen))
  return _Pending(sink, backend, name or kernel_name(kernel), _params(kernel), chosen, kernel.root.shape, start, (key, asked_key), disk)


def _params(kernel: Kernel) -> tuple[UOp, ...]:
  """A kernel's program parameters: every buffer, read or not, inputs 0..n-1 in canonical order, then the output."""
  inputs = sorted((u for u in kernel.canonical_root.toposort() if u.op is Ops.BUFFER), key=lambda b: b.arg.slot)
  return tuple(inputs) + (kernel.canonical_out,)


def compile_program(sink: UOp, backend: Backend, name: str = "kernel", params: Sequence[UOp] | None = None) -> Program:
  """The Program for a SINK that lower() (or a hand-written .uir program) produced. Its parameters are `params` (BUFFERs
  in launch order), by default every BUFFER the program uses, in slot order."""
  if not isinstance(sink, UOp) or sink.op is not Ops.SINK: raise BackendError("compile_program takes a lowered SINK")
  params = tuple(params) if params is not None else tuple(program_buffers(sink))
  key = (backend, sink, params, name)
  if (prog := _programs.get(key)) is not None: return prog
  written = [p for p in params if p.arg.slot in stored_slots(sink)]
  plan = _Pending(sink, backend, name, params, None, (written[-1].shape[0],) if written else (), time.perf_counter(), (key,))
  return plan.finish(backend.compile(plan.compilable, name))


class _Pending:
  """A program linearized, proven safe and rendered, waiting for the backend's compile (which may run in a thread)."""
  def __init__(self, sink: UOp, backend: Backend, name: str, params: tuple[UOp, ...], opts: Opts | None, shape: tuple[int, ...],
               start: float, keys: tuple, plan_path: Path | None = None):
    self.backend, self.name, self.params, self.opts, self.shape, self.start, self.keys = backend, name, params, opts, shape, start, keys
    self.plan_path = plan_path
    self.lin = tuple(linearize(vectorized(sink, backend)))
    if missing := {u for u in self.lin if u.op is Ops.BUFFER} - set(params):
      raise BackendError(f"{name}: the program uses BUFFER slots {sorted(b.arg.slot for b in missing)} that are not among its parameters")
    program = LinearProgram(name, self.lin, params)    # the memory-safety proof, for every backend, before anything is rendered
    self.src = backend.renderer.render(program) if backend.renderer is not None else None
    self.compilable = self.src if self.src is not None else program

  def finish(self, handle: Any) -> Program:
    lin, params = self.lin, self.params
    written = stored_slots(lin)
    flops, nbytes = launch_cost(lin, params)
    global_size, local_size = launch_grid(lin, AxisType.GLOBAL), launch_grid(lin, AxisType.LOCAL)
    prog = Program(self.name, self.src, self.opts, tuple(Param(b.arg.slot, b.dtype, b.shape[0], b.arg.slot in written) for b in params),
                   self.backend, handle, global_size, local_size, self.shape, flops, nbytes, lin)
    if self.plan_path is not None and self.src is not None and self.opts is not None:
      plan = {"name": self.name, "opts": self.opts.to_dict(), "src": self.src, "written": sorted(written), "flops": flops, "nbytes": nbytes,
              "global": global_size, "local": local_size}
      try: write_entry(self.plan_path, json.dumps(plan).encode())
      except OSError: pass     # a cache that can't take it costs the next process a lowering, nothing else
    return _finished(prog, self.keys, self.start, lin)


def _finished(prog: Program, keys: tuple, start: float, lin: Sequence[UOp] = ()) -> Program:
  """Cache `prog` under `keys` and report it (UOPC_DEBUG)."""
  for key in keys: _programs[key] = prog
  if level := debug_level():
    profile.compiled(prog, time.perf_counter() - start)
    if level >= 2: print(f"--- {prog.name} ({prog.backend.name}) ---\n{prog.src if prog.src is not None else format_linear(lin)}", file=sys.stderr)
    if level >= 3 and lin and prog.src is not None: print(f"--- {prog.name}: linearized ---\n{format_linear(lin)}", file=sys.stderr)
  return prog


# ---- plans on disk ---------------------------------------------------------------------------------------------------
# Lowering a kernel (choosing its Opts, rangeify, vectorize, linearize, the proof, rendering) is Python and costs about
# 0.1 s; the backend's disk cache then skips the compiler, but every new process (a test worker, a second `uopc gpt
# train`) lowered every kernel again: most of a warm run's time. A plan is what that road made for one kernel: its
# rendered source and the facts a Program needs (Opts, name, written slots, launch grid, FLOPs and bytes), one
# uopc.compile_cache entry under $UOPC_CACHE_DIR/plans keyed by everything the road reads: uopc's own source, the
# backend, its capabilities and compiler, the canonical kernel, and what was asked (the Opts given, or the default
# policy with the searched Opts it reads from the store). The same inputs make the same program, proven safe when it was
# first made. Only for a backend that renders source, and not under a policy that measures (uopc.search): that one runs.

@functools.cache
def _code_fingerprint() -> str:
  """A hash of the Python source of uopc-ir, uopc-lower and uopc-backends (every file beside the modules the road runs):
  a plan made by other code is never read."""
  import uopc.uop, uopc.rangeify
  digest = hashlib.sha256()
  for d in sorted({Path(m.__file__).parent for m in (uopc.uop, uopc.rangeify, sys.modules[__name__])}):
    for f in sorted(d.rglob("*.py")):
      digest.update(f"{f.relative_to(d).as_posix()}\0".encode())
      digest.update(f.read_bytes())
  return digest.hexdigest()


def _code_bytes(v: Any, depth: int = 0) -> bytes:
  """What an object of the road is, the same in every process: a function's bytecode and constants, a table's entries
  (three levels deep), a plain value's repr, anything else's type."""
  if isinstance(v, (staticmethod, classmethod)): v = v.__func__
  if isinstance(v, property): v = v.fget
  if hasattr(v, "__code__"): return marshal.dumps(v.__code__) + repr(getattr(v, "__defaults__", None)).encode()
  if v is None or isinstance(v, (bool, int, float, str, bytes, Enum)): return repr(v).encode()
  if depth < 3 and isinstance(v, dict):
    return b"{" + b",".join(_code_bytes(k, depth + 1) + b":" + _code_bytes(x, depth + 1) for k, x in v.items()) + b"}"
  if depth < 3 and isinstance(v, (list, tuple, frozenset, set)):
    items = [_code_bytes(x, depth + 1) for x in v]
    return b"[" + b",".join(sorted(items) if isinstance(v, (set, frozenset)) else items) + b"]"
  return f"<{type(v).__module__}.{type(v).__qualname__}>".encode()


_roads: dict[tuple, tuple[list, str]] = {}   # the road's objects by identity (held, so no id is reused) -> their digest


def _road_digest(renderer: Any) -> str:
  """A digest of what the road runs: the passes this module calls and everything `renderer`'s class holds, by their
  code. A process that replaced one of them (a test's mutation) makes programs other plans don't describe."""
  mod = sys.modules[__name__]
  objs = [getattr(mod, n) for n in ("lower", "vectorize", "linearize", "choose_opts", "LinearProgram")]
  objs += [v for c in type(renderer).__mro__ for v in vars(c).values()]
  ids = tuple(map(id, objs))
  if (known := _roads.get(ids)) is None or any(a is not b for a, b in zip(known[0], objs)):
    known = _roads[ids] = (objs, hashlib.sha256(b"\0".join(map(_code_bytes, objs))).hexdigest())
  return known[1]


def _plan_path(kernel: Kernel, backend: Backend, opts: Opts | None, policy: OptsPolicy, name: str | None) -> Path | None:
  """Where the plan for this kernel, backend and request lives; None where plans aren't kept (see above)."""
  if backend.renderer is None or (opts is None and type(policy) is not OptsPolicy): return None
  if opts is not None: asked = json.dumps(opts.to_dict(), sort_keys=True)
  else: asked = "default:" + ((read_entry(stored_opts_path(kernel, backend)) or b"").decode("utf-8", "replace"))
  ident = getattr(backend, "identity", None)
  where = repr((backend.name, backend_caps(backend), ident() if callable(ident) else None, type(backend.renderer).__qualname__))
  text = _kernel_text(kernel.canonical_root, kernel.canonical_out)
  road = f"{_code_fingerprint()}\0{_road_digest(backend.renderer)}"
  digest = hashlib.sha256(f"{road}\0{where}\0{asked}\0{name}\0{text}".encode()).hexdigest()
  return cache_dir() / "plans" / f"{digest[:32]}.json"


def _read_plan(path: Path, kernel: Kernel, backend: Backend, name: str | None, asked_key: tuple) -> Program | _Planned | None:
  """The Program (already in this process) or the plan waiting for its compile that `path` holds; None when it has none."""
  start, data = time.perf_counter(), read_entry(path)
  if data is None: return None
  try:
    plan = json.loads(data)
    opts = Opts.from_dict(plan["opts"])
    grid = tuple(plan["global"]) if plan["global"] is not None else None, tuple(plan["local"]) if plan["local"] is not None else None
    facts = (str(plan["name"]), str(plan["src"]), frozenset(int(s) for s in plan["written"]), int(plan["flops"]), int(plan["nbytes"]))
  except (ValueError, KeyError, TypeError, LowerError): return None
  key = (backend, kernel.canonical_root, kernel.canonical_out, opts, name)
  if (prog := _programs.get(key)) is not None:
    _programs[asked_key] = prog
    return prog
  return _Planned(backend, opts, _params(kernel), kernel.root.shape, grid, facts, (key, asked_key), start)


class _Planned:
  """A plan read from disk, waiting for the backend's compile of its source: a _Pending that lowered nothing."""
  def __init__(self, backend: Backend, opts: Opts, params: tuple[UOp, ...], shape: tuple[int, ...], grid: tuple, facts: tuple, keys: tuple,
               start: float):
    self.backend, self.opts, self.params, self.shape, self.grid, self.keys, self.start = backend, opts, params, shape, grid, keys, start
    self.name, self.src, self.written, self.flops, self.nbytes = facts
    self.compilable = self.src

  def finish(self, handle: Any) -> Program:
    params = tuple(Param(b.arg.slot, b.dtype, b.shape[0], b.arg.slot in self.written) for b in self.params)
    prog = Program(self.name, self.src, self.opts, params, self.backend, handle, *self.grid, self.shape, self.flops, self.nbytes, ())
    return _finished(prog, self.keys, self.start)


def vectorized(sink: UOp, backend: Backend) -> UOp:
  """A lowered program with the vectors `backend`'s machine has (uopc.vectorize): its UPCAST lanes as SIMD vectors where
  it has them (caps.vector_width > 1; else they stay loops), its neighbouring memory moves as wide ones of caps.vector_bytes."""
  caps = backend_caps(backend)
  return vectorize(sink, lanes=caps.vector_width > 1, memory_bytes=caps.vector_bytes)


# ---- running -------------------------------------------------------------------------------------------------------

def run_schedule(kernels: Sequence[Kernel], backend: Backend, buffers: MutableMapping[UOp, Buffer],
                 policy: OptsPolicy = DEFAULT_POLICY, distinct: bool = False) -> Sequence[tuple[Program, list[Buffer]]]:
  """Run `kernels` in order on `backend`. `buffers` maps BUFFER UOps to Buffers: every kernel input must be there, and each
  kernel's output is allocated into it unless it already is (but for a planned schedule's temporaries, the values its
  kernels store for its later kernels: see below). Returns the launches made, as (Program, Buffers). Opts come
  from `policy`; one that measures (uopc.search.Search) sees each kernel's real inputs before the kernel first runs. A
  schedule from kernelize_cached keeps its temporaries for the run alone, in memory shared where their lifetimes allow
  (uopc.memory); `distinct`: each in a Buffer object of its own all the same (an alias: uopc.jit's capture needs them)."""
  if not isinstance(kernels, Schedule) and (not isinstance(kernels, (list, tuple)) or not all(isinstance(k, Kernel) for k in kernels)):
    raise BackendError(f"run_schedule takes a list of Kernels (uopc.kernelize), got {type(kernels).__name__}")
  if not isinstance(policy, OptsPolicy): raise BackendError(f"run_schedule: policy must be an OptsPolicy, got {type(policy).__name__}")
  if not policy.measures and isinstance(kernels, Schedule) and (launches := _run_planned(kernels, backend, buffers, policy, distinct)) is not None:
    return launches
  launches = []
  # every new kernel compiled up front, side by side; a policy that measures first sees each kernel's inputs
  programs = None if policy.measures else compile_kernels(kernels, backend, policy)
  for k in kernels:
    args = []
    for b in k.inputs:
      if (data := buffers.get(b)) is None:
        raise BackendError(f"{kernel_name(k)}: reads a buffer that holds no data ({b.dtype.name}[{b.shape[0]}])")
      args.append(data)
    if programs is None and (backend, k.canonical_root, k.canonical_out, policy, None) not in _programs: policy.first_run(k, backend, args)
    prog = programs[len(launches)] if programs is not None else compile_kernel(k, backend, policy=policy)
    if (out := buffers.get(k.out)) is None: out = buffers[k.out] = Buffer(backend, k.out.shape[0], k.out.dtype)
    args.append(out)
    prog(args)
    launches.append((prog, args))
  return launches


# A schedule that kernelize_cached gave again (a training step's, each step) runs as one LaunchGraph, kept by its Plan in
# the program cache (_programs.graphs, the PLANNED_GRAPHS most recent): its Programs looked up once, its launches unchecked
# past the checks of its table below, and from its 8th run (_PlannedGraph), when it has PLANNED_NATIVE_MIN kernels or
# more, one native call (a plain GPT step: 230 launches, each checked, ~5 ms of Python). Two kernels are enough: a
# launch of its own is a ctypes call and a pointer read a buffer (attention's forward called plainly, 6 kernels: 672-682
# -> 641-646 us). One kernel, or fewer runs (a test's few steps), never pays for a graph's compile.
PLANNED_GRAPHS = 64
PLANNED_NATIVE_MIN = 2
_planned_lock = threading.Lock()


def _run_planned(kernels: Schedule, backend: Backend, buffers: MutableMapping[UOp, Buffer],
                 policy: OptsPolicy, distinct: bool = False) -> Sequence[tuple[Program, list[Buffer]]] | None:
  """run_schedule for a Schedule through its Plan's LaunchGraph, the temporaries in memory shared as uopc.memory says;
  None (nothing run) for whatever the checked road must see: an input that holds no data, a Buffer that is not the
  BUFFER's (backend, dtype, size), one Buffer under two BUFFERs, a kernel given one buffer twice, or the plan's graph
  running in another thread."""
  if (plan := kernels.plan).aliased: return None
  key, graphs = (plan, backend, policy), getattr(_programs, "graphs", {})    # (a plain dict put in its place keeps none)
  with _planned_lock:
    if (entry := graphs.get(key)) is not None: graphs.move_to_end(key)
  if entry is None:
    programs = compile_kernels(kernels, backend, policy)
    graph = _PlannedGraph(list(zip(programs, plan.slots)), native=len(programs) >= PLANNED_NATIVE_MIN)
    shared = schedule_temporaries(kernels, backend)
    with _planned_lock:
      entry = graphs.setdefault(key, (graph, threading.Lock(), shared))
      while len(graphs) > PLANNED_GRAPHS: graphs.popitem(last=False)
  graph, lock, (where, specs) = entry
  written_first, table, seen = plan.written_first, [], set()
  made = [Buffer(backend, n, d) for _, n, d in specs]
  for i, u in enumerate(kernels.table):
    # a temporary: this run's alone (memory it may share; not kept in `buffers`) unless `buffers` already gives it one
    if i in where and (u is None or u not in buffers):
      b = made[where[i]].alias(kernels.temps[i][0] if u is None else u.shape[0]) if distinct else made[where[i]]
    elif u is None: b = Buffer(backend, *kernels.temps[i])
    elif (b := buffers.get(u)) is None:
      if i not in written_first: return None
      b = buffers[u] = Buffer(backend, u.shape[0], u.dtype)
    elif b.backend is not backend or b.dtype is not u.dtype or b.size < u.shape[0] or id(b) in seen: return None
    else: seen.add(id(b))   # one Buffer under two BUFFERs: the checked road refuses it
    table.append(b)
  if not lock.acquire(blocking=False): return None    # (a native graph's pointer table is one per graph)
  try: graph(table)
  finally: lock.release()
  return _Launches(graph.launches, table)


class _Launches(abc.Sequence):   # a planned schedule's (Program, Buffers), made when read: only uopc.jit's capture reads them
  __slots__ = ("launches", "table")
  def __init__(self, launches: list[tuple[Program, list[int]]], table: list[Buffer]): self.launches, self.table = launches, table
  def __len__(self) -> int: return len(self.launches)
  def __getitem__(self, i): return self.launches[i][0], [self.table[s] for s in self.launches[i][1]]


class LaunchGraph:
  """Launches that always run together, in order, on a table of Buffers: `launches` are (Program, slots), and calling
  the graph with the table (a Buffer per slot) launches every Program on the Buffers of its slots, unchecked (whoever
  made the launches checked them once: the JIT replays what run_schedule ran). From its GRAPH_AFTER-th call on, when
  every Program is on one backend that has `graph` (C: one C function calling each kernel; CUDA: one CUDA graph), the
  lot is one native call, built once (never with native=False); until then, or without one, each launch is its own
  call. Under UOPC_DEBUG each launch is timed on its own, as Program calls are."""
  GRAPH_AFTER = 3   # a loop replays a capture many times; a test that replays it twice never pays for building a graph

  def __init__(self, launches: Sequence[tuple[Program, Sequence[int]]], native: bool = True):
    self.launches = [(p, list(slots)) for p, slots in launches]
    self.calls = 0
    self.allow_native = native
    self.native: Any = None
    backends = {id(p.backend): p.backend for p, _ in self.launches}
    self.backend = next(iter(backends.values())) if len(backends) == 1 else None
    self.slots = sorted({s for _, slots in self.launches for s in slots})
    self.index: dict[int, int] = {}
    self._varying: Sequence[int] | None = None
    self._pairs: list[tuple[int, int]] = []

  def __call__(self, table: Sequence[Buffer], varying: Sequence[int] | None = None) -> None:
    """Launch on `table`. `varying`: the only slots whose Buffer may differ from the last call's (a JIT replay knows:
    its arguments' and its outputs'); the native graph then refreshes those pointers alone (when it has `set`)."""
    if debug_level():
      for prog, slots in self.launches: prog([table[s] for s in slots])
      return
    self.calls += 1
    if self.native is None and self.allow_native and self.calls == self.GRAPH_AFTER and self.launches and \
       callable(getattr(self.backend, "graph", None)):
      # a table slot the graph doesn't use is not passed: the graph's own slots are 0..n-1
      self.index = {s: k for k, s in enumerate(self.slots)}
      self.native = self.backend.graph([(p.handle, [self.index[s] for s in slots], p.global_size, p.local_size)
                                        for p, slots in self.launches], len(self.slots))
      self.native([table[s].handle for s in self.slots])
      return
    if self.native is not None:
      if varying is None or not hasattr(self.native, "set"): self.native([table[s].handle for s in self.slots])
      else:
        # the graph's own slots among `varying` (a replay passes its plan's one list each time), found once: a decode
        # step's two graphs, split by its tokens' index check, each looked up all 40 slots the step binds
        if self._varying is not varying: self._varying, self._pairs = varying, [(k, s) for s in varying if (k := self.index.get(s)) is not None]
        if (set_many := getattr(self.native, "set_many", None)) is not None: set_many(self._pairs, table)
        else:
          for k, s in self._pairs: self.native.set(k, table[s].handle)
        self.native.run()
      return
    for prog, slots in self.launches: prog.backend.launch(prog.handle, [table[s].handle for s in slots], prog.global_size, prog.local_size)


class _PlannedGraph(LaunchGraph):
  """A planned schedule's graph (_run_planned): native from its 8th run, not a JIT replay's 3rd. At the 3rd, every test
  that ran a step three times compiled a graph: the sanitizer session's tensor tests took 119 -> 166 s (108 s at the 8th)."""
  GRAPH_AFTER = 8


def program_buffers(program: UOp | Sequence[UOp]) -> list[UOp]:
  """The BUFFERs a lowered program uses, in slot order (its parameters unless told otherwise); two with one slot are an error."""
  nodes = program.toposort() if isinstance(program, UOp) else program
  bufs = sorted({u for u in nodes if u.op is Ops.BUFFER}, key=lambda b: b.arg.slot)
  if len({b.arg.slot for b in bufs}) != len(bufs):
    raise BackendError(f"two BUFFERs share a slot: {sorted((b.arg.slot, b.dtype.name, b.shape[0]) for b in bufs)}")
  return bufs


def stored_slots(program: UOp | Sequence[UOp]) -> set[int]:
  """The slots of the BUFFERs a lowered program stores into."""
  nodes = program.toposort() if isinstance(program, UOp) else program
  # (a STORE not through an INDEX is no store into a slot: the memory-safety proof refuses it)
  return {m.arg.slot for u in nodes if u.op is Ops.STORE and u.src[0].op is Ops.INDEX and (m := base_memory(u.src[0].src[0])).op is Ops.BUFFER}


__all__ = ["cache_dir", "Buffer", "Program", "Param", "ProgramCache", "LaunchGraph", "compile_kernel", "compile_kernels", "compile_program",
           "run_schedule", "np_dtype", "OptsPolicy", "DEFAULT_POLICY", "backend_caps", "stored_opts", "stored_opts_path", "store_opts",
           "program_buffers", "stored_slots", "kernel_name", "format_linear", "debug_level", "profile"]
