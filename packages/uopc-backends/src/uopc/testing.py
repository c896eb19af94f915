"""Conveniences for tests and notebooks, all over uopc.runtime (the one road every kernel takes):

    run_shaped(root, inputs)         lower a shaped graph as one kernel, run it, return the NumPy result
    render_c(sink, name)             the C source of the SINK that lower() returns
    run_c(sink, {slot: array})       run that SINK on the C backend, on NumPy arrays keyed by BUFFER slot, in place
    run_on(backend, sink, arrays)    the same on any backend
    run_lowered(sink, arrays, backend, name)   what run_c and run_on do: arrays checked (check_arrays), run, copied back
"""
from __future__ import annotations
from typing import Sequence
import numpy as np
from uopc.uop import UOp, Ops, buf, prod
from uopc.lowering import Opts
from uopc.kernelize import make_kernel
from uopc.linearize import linearize
from uopc.backends import Backend, BackendError, LinearProgram, get_backend
from uopc.backends.c import CRenderer
from uopc.runtime import Buffer, compile_kernel, compile_program, np_dtype, program_buffers, stored_slots, vectorized


def check_arrays(params: Sequence[UOp], arrays: dict[int, np.ndarray], written: set[int]) -> list[np.ndarray]:
  """The arrays for a program's parameters, after checking each: present, a NumPy array of the BUFFER's dtype,
  C-contiguous, large enough, writeable where the program stores, and not overlapping an array it writes."""
  out = []
  for b in params:
    slot, n, want = b.arg.slot, b.shape[0], np_dtype(b.dtype)
    if slot not in arrays: raise BackendError(f"no array for buffer slot {slot} ({b.dtype.name}[{n}]); got slots {sorted(arrays)}")
    a = arrays[slot]
    if not isinstance(a, np.ndarray): raise BackendError(f"buffer slot {slot}: expected a numpy array, got {type(a).__name__}")
    if a.dtype != want: raise BackendError(f"buffer slot {slot}: expected dtype {want} ({b.dtype.name}), got {a.dtype}")
    if not a.flags.c_contiguous: raise BackendError(f"buffer slot {slot}: the array must be C-contiguous (use np.ascontiguousarray)")
    if a.size < n: raise BackendError(f"buffer slot {slot}: the kernel uses {n} elements, the array has {a.size}")
    if slot in written and not a.flags.writeable: raise BackendError(f"buffer slot {slot}: the kernel writes it, but the array is read-only")
    out.append(a)
  for i, bi in enumerate(params):
    for j in range(i):
      bj = params[j]
      if (bi.arg.slot in written or bj.arg.slot in written) and np.may_share_memory(out[i], out[j]):
        raise BackendError(f"buffers {bj.arg.slot} and {bi.arg.slot} overlap in memory and the kernel writes one of them "
                           "(its pointers are restrict)")
  return out


def run_lowered(sink: UOp, arrays: dict[int, np.ndarray], backend: Backend, name: str = "kernel") -> None:
  """Run a lowered SINK on NumPy arrays keyed by BUFFER slot, in place: each is checked, copied into a Buffer of the
  backend, the program launched, and the buffers it writes copied back into their arrays."""
  if not isinstance(sink, UOp) or sink.op is not Ops.SINK: raise BackendError("run takes the SINK that lower() returns")
  if not isinstance(arrays, dict): raise BackendError(f"the arrays are a dict {{slot: numpy array}}, got {type(arrays).__name__}")
  params = program_buffers(sink)
  written = stored_slots(sink)
  host = check_arrays(params, arrays, written)
  prog = compile_program(sink, backend, name, params)
  device = [Buffer.from_numpy(a.reshape(-1)[:b.shape[0]], backend, b.dtype) for a, b in zip(host, params)]
  prog(device)
  for a, b, d in zip(host, params, device):
    if b.arg.slot in written: a.reshape(-1)[:b.shape[0]] = d.numpy()


def run_shaped(root: UOp, inputs: list[np.ndarray], backend: str = "C", opts: Opts | None = None) -> np.ndarray:
  """Lower a shaped graph whose BUFFERs are slots 0..len(inputs)-1 as one kernel (with `opts`, or the ones uopc.opt
  chooses), run it on `backend` through uopc.runtime, and return the result in root's shape."""
  if not isinstance(root, UOp): raise BackendError(f"run_shaped takes a shaped UOp, got {type(root).__name__}")
  if not isinstance(inputs, (list, tuple)): raise BackendError(f"run_shaped takes a list of input arrays, got {type(inputs).__name__}")
  slots = sorted({u.arg.slot for u in root.toposort() if u.op is Ops.BUFFER})
  if any(s >= len(inputs) for s in slots):
    raise BackendError(f"run_shaped: the graph reads BUFFER slots {slots}, but {len(inputs)} inputs were given")
  be = get_backend(backend)
  n = prod(root.shape)
  kernel = make_kernel(root, buf(len(inputs), max(1, n), root.dtype), canonical=False)   # the program keeps its slots
  prog = compile_kernel(kernel, be, opts)
  try: arrays = [np.ascontiguousarray(inputs[b.arg.slot], np_dtype(b.dtype)).reshape(-1)[:b.shape[0]] for b in kernel.inputs]
  except (ValueError, TypeError) as e: raise BackendError(f"run_shaped: an input can't be read as the numbers its BUFFER holds ({e})") from None
  args = [Buffer.from_numpy(a, be, b.dtype) for a, b in zip(arrays, kernel.inputs)]
  out = Buffer(be, kernel.out.shape[0], root.dtype)
  prog(args + [out])
  return out.numpy()[:n].reshape(root.shape)


def render_c(sink: UOp, name: str = "kernel") -> str:
  """C source for the output of lower(): the prelude and one function `void name(T* restrict dataN, ...)`, one parameter
  per BUFFER of the program in slot order. The program is vectorized for the C backend's machine, linearized and proven
  memory-safe first (by its LinearProgram)."""
  if not isinstance(sink, UOp) or sink.op is not Ops.SINK: raise BackendError("render_c takes the SINK that lower() returns")
  lin = linearize(vectorized(sink, get_backend("C")))
  return CRenderer().render(LinearProgram(name, tuple(lin), tuple(program_buffers(lin))))


def run_c(sink: UOp, buffers: dict[int, np.ndarray], name: str = "kernel") -> None:
  """Render, compile (cached) and run a lowered program on the C backend, on NumPy arrays keyed by BUFFER slot, in place."""
  run_lowered(sink, buffers, get_backend("C"), name)


def run_on(backend: Backend, sink: UOp, buffers: dict, name: str = "kernel") -> None:
  """Run a lowered program on any backend: the NumPy arrays in `buffers` (by BUFFER slot) are checked, copied in, the
  kernel launched, and the arrays it writes copied back (so outputs land in them, as with run_c)."""
  run_lowered(sink, buffers, backend, name)


__all__ = ["run_shaped", "render_c", "run_c", "run_on", "run_lowered", "check_arrays", "np_dtype"]
