"""Test helpers: the book's `run_shaped` (lower a shaped graph, run it, return the NumPy result) and `np_dtype`."""
from __future__ import annotations
import numpy as np
from uopc.uop import UOp, Ops, buf, prod
from uopc.rangeify import Opts
from uopc.kernelize import make_kernel
from uopc.backends import get_backend, BackendError
from uopc.runtime import Buffer, compile_kernel, np_dtype


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


__all__ = ["run_shaped", "np_dtype"]
