"""uopc.search: timing candidate Opts for a kernel on its real buffers, and remembering the winner on disk.

    UOPC_SEARCH=1 python train.py      every kernel met for the first time is searched (run_schedule asks)
    uopc tune train.py                 the same, then a report of what the search found

The heuristics (uopc.opt.choose_opts) read a kernel; a search measures it. It times the heuristics' choice and the
candidates around it (uopc.opt.candidates) on the kernel's real inputs (the output goes to a scratch buffer), the best
of a few launches each, within a time budget per kernel (UOPC_SEARCH_BUDGET seconds, 3 by default: compiling a
candidate is the slow part, so the budget is checked between candidates). A candidate wins only if it beats the
heuristics' choice by MARGIN, so noise never replaces a good choice with an equal one.

The choice is cached on disk under $UOPC_CACHE_DIR/opts, keyed by the canonical kernel, the backend, its capabilities
and its compiler. Entries are written to a temporary file and renamed into place (a reader sees the old entry or the
whole new one), and each carries a SHA-256 of its contents: a damaged entry is ignored, searched again and rewritten.
Every later run, searching or not, uses a cached choice without timing anything (uopc.runtime.compile_kernel asks).
"""
from __future__ import annotations
import hashlib, json, os, tempfile, time
from pathlib import Path
from typing import Callable, Sequence
from uopc.uop import UOp, Ops
from uopc.rangeify import Opts, LowerError
from uopc.kernelize import Kernel
from uopc.opt import Caps, choose_opts, candidates
from uopc.backends import Backend, BackendError
from uopc.runtime import cache_dir

MARGIN = 0.97      # a candidate must take at most 97% of the heuristics' time to replace it
LAUNCHES = 3       # timed launches per candidate (after one warm-up); the best counts


def _identity(backend: Backend) -> str:
  """What makes a measured choice valid: the backend, its capabilities, and its compiler (and target CPU)."""
  ident = getattr(backend, "identity", None)
  return repr((backend.name, getattr(backend, "caps", None), ident() if callable(ident) else None))


def entry_path(kernel: Kernel, backend: Backend) -> Path:
  from uopc.uir import to_uir
  text = to_uir(UOp(Ops.SINK, (kernel.canonical_root, kernel.canonical_out)))
  key = hashlib.sha256(f"{text}\0{_identity(backend)}".encode()).hexdigest()[:32]
  return cache_dir() / "opts" / f"{key}.json"


def _to_json(o: Opts) -> dict:
  return {"upcast": [list(p) for p in o.upcast], "thread": o.thread, "unroll": o.unroll, "tile": [list(p) for p in o.tile], "gpu": o.gpu,
          "local": [list(p) for p in o.local], "vector": list(o.vector) if o.vector is not None else None,
          "reduce_vector": o.reduce_vector, "fma": o.fma}


def _from_json(d: dict) -> Opts:
  return Opts(upcast=[tuple(p) for p in d["upcast"]], thread=d["thread"], unroll=d["unroll"], tile=[tuple(p) for p in d["tile"]],
              gpu=d["gpu"], local=[tuple(p) for p in d["local"]], vector=tuple(d["vector"]) if d["vector"] is not None else None,
              reduce_vector=d["reduce_vector"], fma=d["fma"])


def _seal(body: dict) -> str: return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def cached_opts(kernel: Kernel, backend: Backend) -> Opts | None:
  """The searched choice for this kernel on this backend, or None (no entry, or a damaged one, which is ignored)."""
  try:
    entry = json.loads(entry_path(kernel, backend).read_text())
    if not isinstance(entry, dict) or entry.get("sha256") != _seal(entry["body"]): return None
    return _from_json(entry["body"]["opts"])
  except (OSError, ValueError, KeyError, TypeError, LowerError): return None


def _write(path: Path, body: dict) -> None:
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
      with os.fdopen(fd, "w") as f: f.write(json.dumps({"body": body, "sha256": _seal(body)}))
      os.replace(tmp, path)
    except BaseException:
      try: os.unlink(tmp)
      except OSError: pass
      raise
  except OSError: pass   # an unwritable cache costs the next run a search, nothing else


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
  fastest if it wins by MARGIN, cache it on disk and return it. `timer(program, buffers) -> seconds` and `clock` are
  there for tests; by default launches are timed for real."""
  from uopc.runtime import Buffer, compile_kernel, kernel_name
  from uopc.backends.c import CompileError
  if budget is None: budget = float(os.environ.get("UOPC_SEARCH_BUDGET") or 3.0)
  timer = timer or time_launches
  caps = getattr(backend, "caps", None) or Caps()
  base = choose_opts(kernel, caps)
  scratch = Buffer(backend, kernel.out.shape[0], kernel.out.dtype)
  args = list(inputs) + [scratch]
  start = clock()
  times: dict[Opts, float] = {}
  for o in candidates(kernel, caps, base):
    if o is not base and clock() - start > budget: break
    try: prog = compile_kernel(kernel, backend, o)
    except (LowerError, BackendError, CompileError): continue
    times[o] = timer(prog, args)
  if base not in times: return base
  best = min(times, key=times.__getitem__)
  if times[best] > MARGIN * times[base]: best = base
  _write(entry_path(kernel, backend), {"opts": _to_json(best), "seconds": times[best], "heuristic_seconds": times[base],
                                       "candidates": len(times)})
  searched.append((kernel_name(kernel), times[base], times[best], best))
  return best


def report() -> str:
  """What this process's searches found, one line per kernel, and the total time saved per run of them all."""
  if not searched: return "uopc tune: no kernel was searched (every one had a cached choice, or none ran)"
  lines = [f"uopc tune: searched {len(searched)} kernels"]
  for name, base, best, o in searched:
    lines.append(f"  {name:<28} heuristic {base * 1e3:9.3f} ms  best {best * 1e3:9.3f} ms  x{base / best:5.2f}" +
                 ("" if base == best else f"  {o}"))
  return "\n".join(lines)


__all__ = ["search_opts", "cached_opts", "entry_path", "report", "time_launches", "MARGIN"]
