"""Test helpers: the book's `run_shaped` (lower a shaped graph, run it, return the NumPy result) and `np_dtype`."""
from __future__ import annotations
import numpy as np
from uopc.uop import UOp, Ops, buf, prod
from uopc.rangeify import lower, Ctx, Opts
from uopc.backends import get_backend, BackendError, run_on
from uopc.backends.c import np_dtype, run_c


def run_shaped(root: UOp, inputs: list[np.ndarray], backend: str = "C", opts: Opts | None = None) -> np.ndarray:
  """Lower a shaped graph whose BUFFERs are slots 0..len(inputs)-1, run it, return the result in root's shape.
  The output goes to BUFFER slot len(inputs)."""
  slots = sorted({u.arg.slot for u in root.toposort() if u.op is Ops.BUFFER})
  if any(s >= len(inputs) for s in slots):
    raise BackendError(f"run_shaped: the graph reads BUFFER slots {slots}, but {len(inputs)} inputs were given")
  n = max(1, prod(root.shape))
  out = buf(len(inputs), n, root.dtype)
  res = np.zeros(n, np_dtype(root.dtype))
  arrays = {i: np.ascontiguousarray(a).reshape(-1) for i, a in enumerate(inputs)}
  sink = lower(root, out, Ctx(opts=opts or Opts()))
  if backend.upper() == "C": run_c(sink, {**arrays, len(inputs): res})     # the fast path: straight on the arrays
  else: run_on(get_backend(backend), sink, {**arrays, len(inputs): res})
  return res[:prod(root.shape)].reshape(root.shape)


__all__ = ["run_shaped", "np_dtype"]
