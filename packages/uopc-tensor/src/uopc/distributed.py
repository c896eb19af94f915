"""uopc.distributed: data-parallel training over MPI, the way PyTorch's DistributedDataParallel works.

    mpiexec -n 2 uopc gpt train --batch 64        # or `uopc gpt train --nproc 2 --batch 64`: it runs mpiexec itself

    from uopc import distributed as dist
    rank, world = dist.init()                     # (0, 1) in a single process, with or without mpi4py installed
    dist.broadcast(model.parameters())            # every rank starts from rank 0's weights
    for x, y in batches:                          # every rank draws the same batch and takes its rows
      rows = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
      loss = grads(x[rows], y[rows])              # a jitted forward and backward (uopc.jit)
      dist.allreduce([loss] + [p.grad for p in params])       # the mean over the ranks, in few calls (buckets)
      update()                                    # a jitted optimizer step: the same update on every rank

Every rank holds the whole model. MPI (mpi4py, with the mpich wheel: `pip install 'uopc-tensor[dist]'`) moves the
data; nothing here is a transport of its own. The same command runs across machines with a hostfile
(`mpiexec -f hosts -n 8 uopc gpt train ...`, MPICH's Hydra): MPI picks the network.

allreduce and broadcast replace the values of the tensors they are given (as torch.distributed's in-place collectives
do), each with a new buffer: a buffer is never written after it is filled (uopc.tensor.storage), so a tensor that
shared the old value keeps it. On the C backend the buffers are host memory and MPI reads and writes them directly:
a tensor alone in its bucket goes from its buffer to its new one in one MPI call, no copy; several small tensors are
packed into one bucket first (a copy), so that a model of a hundred parameters is a few MPI calls, not a hundred. A
GPU backend's tensors go through host memory for now.

A jitted function cannot call MPI from inside a replay (a replay runs only kernels), so a training step is two jitted
parts with the allreduce between them (`uopc.gpt.training_step` does this when the world is larger than one).

Faults: `fail(exc)` prints one line naming the rank and its error and aborts the whole job (MPI_Abort), so no rank
waits for a peer that is gone; `uopc gpt train` calls it on any error. A rank killed outright is noticed by mpiexec,
which stops the others. UOPC_DEBUG=1 prints a line per allreduce (its tensors, bytes, calls and time), as it does per
kernel; `stats()` gives the totals.
"""
from __future__ import annotations
import os, sys, time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence
import numpy as np
from uopc.runtime import Buffer, debug_level, np_dtype
from uopc.tensor import Tensor, TensorError
from uopc.tensor.capture import capturing
from uopc.tensor.storage import buffer_of, name_buffer

BUCKET_BYTES = 25 * 2 ** 20   # tensors packed into one allreduce call up to this many bytes (PyTorch DDP's default)
OPS = ("mean", "sum", "max", "min")
# what launchers set in every process they start: a process that has one of these and no mpi4py was meant to be a rank
_LAUNCHER_SIZE = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "PMIX_SIZE")


class DistributedError(TensorError):
  """A collective that can't run as asked: mpi4py missing where MPI launched the process, tensors that aren't what a
  collective takes, an unknown reduction."""


@dataclass
class _World:
  comm: Any = None        # mpi4py's COMM_WORLD, or None in a single process
  rank: int = 0
  size: int = 1
  seconds: float = 0.0    # spent in allreduce, and its calls (stats())
  calls: int = 0
  bytes: int = 0


_world: _World | None = None


def _launched_size() -> int:
  """How many processes a launcher says this job has (1 when none started this one)."""
  for name in _LAUNCHER_SIZE:
    try:
      if (n := int(os.environ.get(name, "") or 0)) > 0: return n
    except ValueError: pass
  return 1


def init() -> tuple[int, int]:
  """(rank, world size) of this process; MPI is set up on the first call. Without mpi4py a single process is world size
  1 (no MPI needed); a process mpiexec started as one of several without mpi4py is an error, not a silent world of one
  (each rank would train alone and write the same checkpoint)."""
  global _world
  if _world is not None: return _world.rank, _world.size
  try: from mpi4py import MPI
  except ImportError:
    if (n := _launched_size()) > 1:
      raise DistributedError(f"this process was started as one of {n} MPI processes, but mpi4py is not installed: "
                             "pip install 'uopc-tensor[dist]' (mpi4py and the mpich wheel)") from None
    _world = _World()
    return 0, 1
  comm = MPI.COMM_WORLD
  _world = _World(comm if comm.Get_size() > 1 else None, comm.Get_rank(), comm.Get_size())
  if (pids := os.environ.get("UOPC_DIST_PIDS")) and _world.size > 1:   # `uopc gpt train --nproc` names a killed rank by it
    try: Path(pids, str(_world.rank)).write_text(str(os.getpid()))
    except OSError: pass
  return _world.rank, _world.size


def rank() -> int: return init()[0]
def world_size() -> int: return init()[1]


def barrier() -> None:
  """Wait until every rank has called barrier()."""
  init()
  if _world.comm is not None: _world.comm.Barrier()


def fail(exc: BaseException | str) -> None:
  """Report this rank's error in one line naming the rank, and stop every rank of the job (MPI_Abort): the others would
  otherwise wait forever in their next collective. In a single process it returns (the caller reports as usual)."""
  init()
  if _world.comm is None: return
  msg = str(exc).strip() or type(exc).__name__ if isinstance(exc, BaseException) else str(exc)
  print(f"uopc: error: rank {_world.rank} of {_world.size} failed: {msg}", file=sys.stderr, flush=True)
  # the line is in the pipe to mpiexec's proxy, which forwards it when its event loop reads it; told to abort first, it
  # could stop everything with the line unread (a test under load saw the job end with an empty stderr, 1 run in 6)
  time.sleep(0.2)
  _world.comm.Abort(1)
  os._exit(1)      # MPICH's MPI_Abort may return before mpiexec has stopped this process: no traceback after the line


def _checked(tensors: Sequence[Tensor], what: str) -> list[Tensor]:
  if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
    raise DistributedError(f"{what} takes a list of Tensors, got {type(tensors).__name__}")
  for k, t in enumerate(tensors):
    if not isinstance(t, Tensor): raise DistributedError(f"{what}: item {k} is a {type(t).__name__}, not a Tensor")
  seen: set[int] = set()
  out = []
  for t in tensors:               # a tensor given twice is reduced once (its value would be counted twice otherwise)
    if id(t) not in seen and t.numel():
      seen.add(id(t))
      out.append(t)
  if out: out[0].realize(*out[1:])   # one schedule: a loss and the gradients share their forward pass
  return out


def _buckets(tensors: list[Tensor], limit: int) -> list[list[Tensor]]:
  """Consecutive tensors of one dtype and device, up to `limit` bytes a bucket (a larger tensor is a bucket alone)."""
  out: list[list[Tensor]] = []
  size = 0
  for t in tensors:
    nbytes = t.numel() * t.dtype.itemsize
    if out and out[-1][0].dtype is t.dtype and out[-1][0].device == t.device and size + nbytes <= limit:
      out[-1].append(t)
      size += nbytes
    else:
      out.append([t])
      size = nbytes
  return out


def _host(t: Tensor) -> np.ndarray | None:
  """t's memory as a NumPy array MPI can read in place (the C backend's), else None (a copy goes through the host)."""
  h = buffer_of(t.uop).handle
  return h[:t.numel()] if isinstance(h, np.ndarray) else None


def _give(t: Tensor, fill, backend) -> None:
  """Give t a new buffer of its size on `backend`, filled by fill(flat NumPy array to write), as its value (a tensor
  that shared the old buffer keeps the old value)."""
  b = Buffer(backend, t.numel(), t.dtype)
  if isinstance(b.handle, np.ndarray): fill(b.handle[:t.numel()])
  else:
    arr = np.empty(t.numel(), np_dtype(t.dtype))
    fill(arr)
    b.copyin(arr)
  # realized, so no graph to mark lazy, and never inside a capture (_not_captured); a fresh buffer no one else names
  t.uop = name_buffer(b, t.shape, alias=False)


def _unpack(bucket: list[Tensor], flat: np.ndarray, backend, scale: float | None = None) -> None:
  """Give each tensor of `bucket` its part of `flat` (the bucket packed in order), times `scale` when given, in one
  pass over the bucket."""
  at = 0
  for t in bucket:
    part = flat[at:at + t.numel()]
    _give(t, (lambda dst, part=part: np.copyto(dst, part)) if scale is None else (lambda dst, part=part: np.multiply(part, scale, out=dst)),
          backend)
    at += t.numel()


def _not_captured(what: str) -> None:
  if capturing() is not None:
    raise DistributedError(f"{what} inside a function uopc.jit is capturing: a replay runs the captured kernels only and would "
                           "skip it; call it between jitted functions (uopc.gpt.training_step jits the step in two parts)")


def allreduce(tensors: Sequence[Tensor], op: str = "mean", bucket_bytes: int = BUCKET_BYTES) -> list[Tensor]:
  """Reduce each tensor across the ranks (op: "mean", the default, "sum", "max" or "min") and give it the result, in
  place as torch.distributed.all_reduce does (a new buffer: see the module docstring). Tensors are realized first (in
  one schedule) and go in as few MPI calls as `bucket_bytes` allows. Every rank must pass tensors of the same shapes
  and dtypes in the same order. Returns the tensors. In a single process the values are already the result."""
  if op not in OPS: raise DistributedError(f"allreduce: op must be one of {', '.join(map(repr, OPS))}, got {op!r}")
  if type(bucket_bytes) is not int or bucket_bytes < 1: raise DistributedError(f"allreduce: bucket_bytes must be an int >= 1, got {bucket_bytes!r}")
  _not_captured("allreduce")
  given = list(tensors) if isinstance(tensors, (list, tuple)) else tensors
  todo = _checked(given, "allreduce")
  if op == "mean" and (ints := [t for t in todo if not t.dtype.is_float]):   # refused before anything is reduced
    raise DistributedError(f"allreduce: the mean of {ints[0].dtype.name} tensors is not one (use op='sum')")
  init()
  if _world.comm is None: return list(given)
  from mpi4py import MPI
  mpi_op = {"mean": MPI.SUM, "sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
  comm, start, nbytes = _world.comm, time.perf_counter(), 0
  buckets = _buckets(todo, bucket_bytes)
  for bucket in buckets:
    scale = 1.0 / _world.size if op == "mean" else None
    backend = buffer_of(bucket[0].uop).backend
    hosts = [_host(t) for t in bucket]
    if len(bucket) == 1 and hosts[0] is not None:        # straight from one buffer into the next
      def fill(dst, src=hosts[0]):
        comm.Allreduce(src, dst, op=mpi_op)
        if scale is not None: dst *= scale
      _give(bucket[0], fill, backend)
      nbytes += hosts[0].nbytes
      continue
    flat = np.concatenate([h if h is not None else buffer_of(t.uop).numpy()[:t.numel()] for t, h in zip(bucket, hosts)])
    comm.Allreduce(MPI.IN_PLACE, flat, op=mpi_op)
    nbytes += flat.nbytes
    _unpack(bucket, flat, backend, scale)
  seconds = time.perf_counter() - start
  _world.seconds, _world.calls, _world.bytes = _world.seconds + seconds, _world.calls + len(buckets), _world.bytes + nbytes
  if debug_level():
    print(f"uopc MPI    allreduce {len(todo)} tensors{'':<10} {nbytes / 2 ** 20:8.2f} MiB in {len(buckets)} calls {seconds * 1e3:9.3f} ms "
          f"{nbytes / max(seconds, 1e-9) / 1e9:9.2f} GB/s", file=sys.stderr)
  return list(given)


def broadcast(tensors: Sequence[Tensor], root: int = 0, bucket_bytes: int = BUCKET_BYTES) -> list[Tensor]:
  """Give every rank rank `root`'s values of `tensors` (in place, as allreduce): the initial weights, so that every rank
  starts from the same model whatever its seed. Every rank passes tensors of the same shapes and dtypes, in order."""
  _not_captured("broadcast")
  todo = _checked(list(tensors) if isinstance(tensors, (list, tuple)) else tensors, "broadcast")
  r, size = init()
  if type(root) is not int or not 0 <= root < size: raise DistributedError(f"broadcast: root must be a rank in 0..{size - 1}, got {root!r}")
  if _world.comm is None: return list(tensors)
  comm = _world.comm
  for bucket in _buckets(todo, bucket_bytes):
    flat = np.concatenate([buffer_of(t.uop).numpy()[:t.numel()] for t in bucket]) if r == root else \
      np.empty(sum(t.numel() for t in bucket), np_dtype(bucket[0].dtype))
    comm.Bcast(flat, root=root)
    if r != root: _unpack(bucket, flat, buffer_of(bucket[0].uop).backend)
  return list(tensors)


def stats() -> dict[str, float]:
  """What allreduce did in this process so far: seconds, MPI calls and bytes reduced."""
  init()
  return {"seconds": _world.seconds, "calls": _world.calls, "bytes": _world.bytes}


__all__ = ["init", "rank", "world_size", "barrier", "allreduce", "broadcast", "fail", "stats", "DistributedError", "BUCKET_BYTES"]
