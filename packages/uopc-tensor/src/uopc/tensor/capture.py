"""uopc.tensor.capture: the hook uopc.jit records a call through, and the whole of the frontend it may touch.

uopc.jit replays a function's kernel launches without running its body. To know what to replay it makes a Capture
current in its thread (`with Capture(strict) as cap:`) and runs the function once: while the capture is current,
realize() appends every launch it makes, assign() every tensor whose value it replaces, the random functions every
batch they draw, and index checks every check, each where the plain call does it (one `capturing()` test on each of
those roads, and numpy() refuses to read a value inside a strict capture; nothing else in the frontend knows a
capture exists). A replay then binds buffers itself, so it must know where a tensor's value lives and name memory of
its own: the rest of this module's __all__ is that surface (re-exported from uopc.tensor.storage). uopc.jit uses
nothing else of the frontend but Tensor with its public attributes (uop, grad, device, requires_grad) and methods,
and JitError.
"""
from __future__ import annotations
import threading
from typing import Any, Callable, NamedTuple
import numpy as np
from uopc.uop import UOp, Ops
from uopc.evaluate import run, to_python, EvalError
from uopc.runtime import Buffer
from uopc.tensor.errors import TensorError, JitError
from uopc.tensor.storage import name_buffer, named, buffer_of, is_realized, realize_lazy_state, grad_leaves, generator


class Capture:
  """What uopc.jit records while a call of a jitted function runs in this thread: every launch the call makes (Program and
  Buffers), every tensor whose value it replaced (assign, with the value the tensor held before), every batch of random
  numbers it drew (the Buffer they went into and how to draw them again) and every index check. `strict` while it
  captures (the call a replay will repeat): reading a value there is refused. `with Capture(strict) as cap:` makes it the
  current one in this thread; `capturing()` returns it."""
  def __init__(self, strict: bool):
    self.strict = strict
    self.launches: list[tuple[Any, list[Buffer]]] = []
    self.assigned: list[tuple[Any, UOp]] = []               # (the Tensor, the uop it held before)
    self.index_checks: list[tuple[int, IndexCheck]] = []   # (launches made before it, the check): a replay repeats it there
    self.draws: list[tuple[Buffer, Callable[[np.random.Generator], np.ndarray]]] = []
    self._outer: Capture | None = None

  def __enter__(self) -> Capture:
    self._outer, _current.capture = _current.capture, self
    return self

  def __exit__(self, *exc) -> None: _current.capture = self._outer


class _Current(threading.local):
  capture: Capture | None = None   # a capture belongs to its thread: another thread's launches and assigns are its own


_current = _Current()


def capturing() -> Capture | None:
  """The uopc.jit capture running in this thread, or None (almost always)."""
  return _current.capture


def refuse_read_while_capturing(what: str) -> None:
  """Reading a value (numpy, item, tolist) inside a strict capture is an error: a replay would return the capture's value."""
  if (cap := _current.capture) is not None and cap.strict:
    raise JitError(f"{what} inside a function uopc.jit is capturing: a replay runs only the captured kernels, so the value "
                   "read here would be the capture's on every call. Return the tensor and read it after the call instead")


class IndexCheck(NamedTuple):
  """Integer indices that must lie in [low, high) (`ignore` excepted): the first `n` values of `buffer`. A gather here
  is a one-hot mask and a sum, which silently gives 0 for an index that hits nothing, so the values are checked as
  PyTorch checks them, on the realized data; `message` says what was indexed, with {} for the bad value."""
  buffer: Buffer
  n: int
  low: int
  high: int
  message: str
  ignore: int | None = None

  def run(self) -> None:
    v = self.buffer.numpy()[:self.n]
    # every value in range, the common case, in two reductions (a decode step's tokens were checked by four ufuncs)
    if not (v.size and self.low <= v.min() and v.max() < self.high): self.refuse(v)

  def refuse(self, v: np.ndarray) -> None:
    """Raise the check's TensorError for the first of the values `v` outside [low, high)."""
    outside = (v < self.low) | (v >= self.high)
    if self.ignore is not None: outside &= v != self.ignore
    if outside.any(): raise TensorError(self.message.format(int(v[int(np.argmax(outside))])))


CONSTANT_INDICES = 256   # indices with no memory under them, up to this many, are checked on the host when the graph is built


def check_indices(index, low: int, high: int, message: str, ignore: int | None = None) -> None:
  """Refuse the values of the i32 Tensor `index` outside [low, high) (see IndexCheck). The index tensor is realized for
  it; a uopc.jit capture records the check after the launches made so far, and every replay repeats it at that point."""
  if index.numel() == 0: return
  if index.numel() <= CONSTANT_INDICES and not any(u.op is Ops.BUFFER for u in index.uop.toposort()):
    # indices made of constants alone (an ONNX Gather's index, x[:, -1]): checked here, on the host, once; realized,
    # they were a kernel of their own and a check that every jit replay ran again
    try: values = np.asarray(to_python(run(index.uop)), dtype=np.int64).reshape(-1)
    except EvalError: values = None
    if values is not None:
      IndexCheck(None, values.size, low, high, message, ignore).refuse(values)
      return
  index.realize()
  check = IndexCheck(buffer_of(index.uop), index.numel(), low, high, message, ignore)
  if (cap := _current.capture) is not None: cap.index_checks.append((len(cap.launches), check))
  check.run()


__all__ = ["Capture", "capturing", "IndexCheck", "name_buffer", "named", "buffer_of", "is_realized", "realize_lazy_state", "grad_leaves",
           "generator"]
