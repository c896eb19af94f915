"""uopc.tensor.core: what a Tensor is and how it runs: its state, realize, reading values, assign, and autograd's entry.

A Tensor holds one shaped UOp (`uop`), its `device` (a backend's name), `requires_grad` and `grad`. Every op makes a
new Tensor around a new UOp (`_new`, the one constructor the ops use); nothing runs until a value is asked for.
`realize()` (or numpy/item/tolist) kernelizes the graph, lowers and compiles each kernel (cached by its structure, so a
training loop compiles once), runs the kernels on the backend, and replaces the tensor's graph by the BUFFER that
holds its value (uopc.tensor.storage keeps the memory). `assign` gives the same tensor object another value, lazily:
how an optimizer updates a parameter everyone holds. `backward` and `gradient` differentiate the graph with
uopc.grad, seeing through values realized on the way (storage.history), so backward passes fuse like forward ones.

TensorCore is this alone; uopc.tensor.Tensor composes it with one mixin per theme (creation, elementwise math,
reductions, movement, indexing, the functional pieces), tinygrad's way. A mixin reaches its own class as type(self)
and tests for a tensor with isinstance(x, TensorCore), so no module here imports the composed class. Broadcasting and
dtype promotion (`_operands`) sit here too: every binary op goes through them.
"""
from __future__ import annotations
import functools, math, os, reprlib, threading, weakref
from typing import Any, NamedTuple
import numpy as np
from uopc.dtype import DType, dtypes, I32_MIN, I32_MAX
from uopc.uop import UOp, Ops, prod
from uopc.kernelize import kernelize, kernelize_cached, Kernel, Schedule
from uopc.backends import BackendError, get_backend
from uopc.runtime import Buffer, run_schedule, np_dtype, backend_caps
from uopc.opt import graph_rewrite
from uopc.search import policy_from_env
from uopc.grad import gradient as grad_of
from uopc.tensor.errors import TensorError, TensorIndexError, TensorTypeError
from uopc.tensor.args import NP_TO_DTYPE, to_dtype, dtype_named, check_size, broadcast_shape, promote
from uopc.tensor.storage import (buffers, history, new_buffer, name_buffer, buffer_uop, buffer_of, is_realized, mark_lazy, mark_grad_leaf,
                                 is_grad_leaf, grad_leaves, hold_graph, release_graph)
from uopc.tensor.capture import capturing, refuse_read_while_capturing


class _Differentiated(threading.local):
  """The unrealized tensors backward() was last called on, in this thread (weakly held): an optimizer's step realizes
  them in its own schedule. `loss.backward(); opt.step(); loss.item()` computed the forward twice otherwise: once in
  the step's schedule for the gradients, and again, from the weights, for the loss alone (a GPT step: 5.8 GFLOP for
  2.9 of work), because a value that isn't asked for in a schedule is not kept."""
  def __init__(self): self.refs: list[weakref.ref] = []
  def add(self, t: TensorCore) -> None:
    self.refs = [r for r in self.refs if r() is not None and r() is not t] + [weakref.ref(t)]
  def take(self) -> list[TensorCore]:
    """The ones still alive and unrealized; forgotten here."""
    out, self.refs = [t for r in self.refs if (t := r()) is not None and not is_realized(t.uop)], []
    return out


_differentiated = _Differentiated()


def differentiated() -> list[TensorCore]:
  """The unrealized tensors backward() was called on since the last call here (this thread's): what an optimizer's
  step realizes beside the parameters, so the loss shares the forward pass the gradients already compute."""
  return _differentiated.take()


def default_device() -> str:
  """The backend a tensor is made on when none is named: $UOPC_DEVICE, or C."""
  return os.environ.get("UOPC_DEVICE", "").strip().upper() or "C"


def f16_in_f32(fn):
  """A float function of an f16 tensor computed in f32 and rounded to f16 once, as torch and NumPy compute f16 math.
  f16 holds 11 significant bits: a sum of 3000 f16 ones stopped at 2048 (2049 rounds back to 2048), a softmax over
  3000 logits gave 1/2048 each, and a composite such as exp (a product, then exp2) or tanh rounded at every step.
  The result is f16 unless a float Tensor argument promotes it to f32 (f16 logits with f32 targets give f32)."""
  @functools.wraps(fn)
  def wrapper(self, *args, **kwargs):
    if self.dtype is not dtypes.f16: return fn(self, *args, **kwargs)
    others = [a.dtype for a in (*args, *kwargs.values()) if isinstance(a, TensorCore) and a.dtype.is_float]
    out = fn(self.float(), *args, **kwargs)
    return out.cast(dtypes.f16) if promote(dtypes.f16, *others) is dtypes.f16 and out.dtype is dtypes.f32 else out
  return wrapper


class ValuesIndices(NamedTuple):
  """What sort, topk, cummax, cummin and max_pool2d(return_indices=True) return: t.sort(0).values and t.sort(0)[0] both
  work, as with torch's return types."""
  values: TensorCore
  indices: TensorCore


def broadcast_uop(u: UOp, shape: tuple[int, ...]) -> UOp:
  """u broadcast to `shape`, a shape its own broadcasts to (broadcast_shape's answer): ones prepended, a RESHAPE, then an
  EXPAND of its axes of 1. TensorCore._broadcast_to and the binary ops' operands build every broadcast through it."""
  if u.shape == shape: return u
  if len(u.shape) < len(shape): u = u.reshape((1,) * (len(shape) - len(u.shape)) + u.shape)
  return u if u.shape == shape else u.expand(shape)


class TensorCore:
  """A lazy n-dimensional array: a shaped UOp graph, computed on `realize()`."""
  __slots__ = ("uop", "requires_grad", "grad", "device", "__weakref__")
  __array_ufunc__ = None   # `np.float32(2) * t` defers to Tensor.__rmul__ instead of NumPy iterating over t

  def __init__(self, data: Any, dtype=None, requires_grad: bool = False, device: str | None = None):
    if device is not None and not isinstance(device, str): raise TensorError(f"device must be a backend's name (a str), got {device!r}")
    self.device = (device or default_device()).upper()
    get_backend(self.device)   # fail early on an unknown device
    dtype = to_dtype(dtype)
    self.grad = None
    if isinstance(data, UOp): self.uop = data if dtype is None or data.dtype is dtype else data.cast(dtype)
    elif isinstance(data, TensorCore): self.uop = data.uop if dtype is None else data.uop.cast(dtype)
    else:
      try: arr = data if isinstance(data, np.ndarray) else np.asarray(data)
      except (ValueError, TypeError, RecursionError):   # NumPy 2 refuses ragged lists itself; a list nested 10^5 deep recurses
        raise TensorError(f"can't make a Tensor from {type(data).__name__} {reprlib.repr(data)}: ragged or not numbers") from None
      check_size(arr.shape, "Tensor")
      if arr.dtype.kind in "USV": raise TensorError(f"can't make a Tensor of {arr.dtype} data {reprlib.repr(data)}: not numbers")
      if arr.dtype == object: raise TensorError(f"can't make a Tensor from {type(data).__name__} {reprlib.repr(data)}: ragged or not numbers")
      if dtype is None:
        if arr.dtype not in NP_TO_DTYPE: raise TensorError(f"NumPy dtype {arr.dtype} has no uopc dtype (bool, int32, float16, float32)")
        dtype = NP_TO_DTYPE[arr.dtype]
      # (only integers wider than i32's range can leave it: a decode step's i32 tokens skip the two reductions)
      if arr.dtype.kind in "iu" and arr.dtype.itemsize >= (8 if arr.dtype.kind == "i" else 4) and arr.size and \
         (arr.max() > I32_MAX or arr.min() < I32_MIN) and dtype is dtypes.i32:
        raise TensorError("integer data doesn't fit in i32")
      # not np.ascontiguousarray, which makes a 0-d array 1-d
      self.uop = TensorCore._from_numpy(np.asarray(arr, dtype=np_dtype(dtype), order="C"), dtype, self.device)
    self.requires_grad = False
    if requires_grad: self.requires_grad_(True)

  @staticmethod
  def _from_numpy(arr: np.ndarray, dtype: DType, device: str) -> UOp:
    b = new_buffer(arr.size, dtype)
    buffers[b] = Buffer.from_numpy(arr.reshape(-1) if arr.size else np.zeros(1, arr.dtype), get_backend(device), dtype)
    if not arr.size: return b.shrink(((0, 0),)).reshape(arr.shape)   # a BUFFER holds at least one element: view none of it
    return b.reshape(arr.shape) if arr.shape != b.shape else b

  def requires_grad_(self, flag: bool = True) -> TensorCore:
    if flag:
      if not self.dtype.is_float: raise TensorError(f"only float tensors can require gradients, this one is {self.dtype.name}")
      if not is_realized(self.uop): self.realize()   # a leaf must be its own BUFFER: two zero tensors are one hash-consed graph
      mark_grad_leaf(self)
    self.requires_grad = flag
    return self

  # ---- properties
  @property
  def shape(self) -> tuple[int, ...]: return self.uop.shape
  @property
  def dtype(self) -> DType: return self.uop.dtype
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> int: return prod(self.shape)
  def size(self, dim: int | None = None): return self.shape if dim is None else self.shape[self._dim(dim)]
  def __len__(self) -> int:
    if not self.shape: raise TensorError("len() of a 0-d tensor")
    return self.shape[0]
  def __iter__(self): return (self[i] for i in range(len(self)))   # __getitem__'s TensorError would not end the iteration
  def __repr__(self) -> str:
    return f"<Tensor shape={self.shape} dtype={self.dtype.name} device={self.device}{' requires_grad' if self.requires_grad else ''}>"

  # ---- dimensions
  def _dim(self, d: int, extra: int = 0) -> int:
    """Dimension d (negative counts from the end) of a tensor with `extra` more axes; a 0-d tensor has dims 0 and -1."""
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)): raise TensorTypeError(f"a dimension must be an int, got {d!r}")
    n = max(self.ndim + extra, 1)
    if not -n <= d < n: raise TensorIndexError(f"dimension {d} out of range for a tensor of shape {self.shape} (expected {-n} to {n - 1})")
    return int(d) % n

  def _axes(self, axis) -> list[int]:
    """The axes `axis` names (None: all), sorted. A 0-d tensor takes axis 0 and -1 as PyTorch does, and has none to reduce."""
    if axis is None: return list(range(self.ndim))
    axes = sorted({self._dim(a) for a in (axis if isinstance(axis, (tuple, list)) else [axis])})
    return axes if self.ndim else []

  def _tensor_arg(self, x, what: str) -> TensorCore:
    """An argument that must be a Tensor (a weight, an index); arrays and lists are taken as one."""
    if isinstance(x, TensorCore): return x
    if isinstance(x, (np.ndarray, list, tuple)): return type(self)(x)
    raise TensorError(f"{what} must be a Tensor, got {type(x).__name__}")

  # ---- running
  def schedule(self, *others: TensorCore) -> list[Kernel]:
    """The kernels realize() would run for this tensor (and `others`), without running them."""
    ts = [t for t in (self, *others) if not is_realized(t.uop)]
    rewrite = graph_rewrite(backend_caps(get_backend(self.device)))
    return kernelize([(t.uop, new_buffer(t.numel(), t.dtype)) for t in ts], new_buffer, rewrite) if ts else []

  def realize(self, *others: TensorCore) -> TensorCore:
    """Compute this tensor (and `others`, in the same schedule so they share work); returns self. Each tensor gets a
    buffer of its own, even where two hold one graph (Tensor.zeros(3) twice): two tensors are one buffer only when they
    are one tensor, so writing one (load_state_dict) or differentiating by one never reaches the other."""
    todo = list({id(t): t for t in (self, *others) if not is_realized(t.uop)}.values())
    if not todo: return self
    release_graph(roots := tuple(t.uop for t in todo))   # (the last graph's memory back in the pool first)
    outs = [(u, new_buffer(t.numel(), t.dtype)) for t, u in zip(todo, roots)]
    backend = get_backend(self.device)
    # the graph as the backend's machine wants it (the C backend packs GEMM operands: uopc.opt.graph_rewrite)
    kernels = kernelize_cached(outs, new_buffer, graph_rewrite(backend_caps(backend)))
    # a capture (uopc.jit) tells temporaries apart by their Buffers: each its own object (the memory still shared)
    launches = run_schedule(kernels, backend, buffers, policy_from_env(), distinct=(cap := capturing()) is not None)
    if cap is not None: cap.launches += launches
    elif isinstance(kernels, Schedule): hold_graph(roots, len(kernels), kernels.table, {b for _, b in outs})
    for t, (u, b) in zip(todo, outs):
      # a value computed from gradient leaves (not a leaf itself: an optimizer's update is a fresh start) keeps its graph
      if t.requires_grad and not is_grad_leaf(t): history[b] = u.reshape(b.shape) if u.shape != b.shape else u
      t.uop = b.reshape(u.shape) if u.shape != b.shape else b
    return self

  def contiguous(self) -> TensorCore:
    """The same value, materialized in its own row-major layout when it is next computed (a STAGE): its consumers read
    a buffer instead of recomputing it through views (a convolution's padded input)."""
    return self._new(UOp(Ops.STAGE, (self.uop,)), self)
  def clone(self) -> TensorCore: return self.contiguous()   # a copy of its own: writing into one doesn't show in the other

  def numpy(self) -> np.ndarray:
    refuse_read_while_capturing(".numpy() / .item() / .tolist()")
    if self.numel() == 0: return np.zeros(self.shape, np_dtype(self.dtype))
    return buffer_of(self.realize().uop).numpy()[:self.numel()].reshape(self.shape)

  def item(self):
    if self.numel() != 1: raise TensorError(f"item() needs a tensor with one element, this one has shape {self.shape}")
    return self.numpy().reshape(()).item()

  def tolist(self): return self.numpy().tolist()
  def __bool__(self):
    if self.numel() != 1: raise TensorError(f"the truth value of a tensor of shape {self.shape} is ambiguous")
    return bool(self.item())
  def __float__(self): return float(self.item())
  def __int__(self): return int(self.item())

  # ---- new tensors from this one
  def _new(self, uop: UOp, *parents: TensorCore) -> TensorCore:
    t = object.__new__(type(self))
    t.uop, t.grad, t.device = uop, None, self.device
    t.requires_grad = self.requires_grad or any(p.requires_grad for p in parents if isinstance(p, TensorCore))
    return t

  def detach(self) -> TensorCore:
    """The same value, cut from the graph: it requires no gradient and backward() never reaches through it. As torch's,
    it is the value now: a tensor not computed yet is realized first, and the result names the same memory without the
    graph realize() keeps for backward (a list of detached losses holds numbers, not every step's model)."""
    if self.numel() == 0: return type(self)(np.zeros(self.shape, np_dtype(self.dtype)), device=self.device)
    t = object.__new__(type(self))
    t.uop, t.grad, t.device, t.requires_grad = name_buffer(buffer_of(self.realize().uop), self.shape), None, self.device, False
    return t

  def _stop_gradient(self) -> TensorCore:
    """The same value, lazily, with no gradient flowing back through it (a same-dtype CAST is the marker): what the
    composites here use inside a graph, where detach() would compute the value on its own."""
    return self._new(UOp(Ops.CAST, (self.uop,), self.dtype)) if self.dtype.is_float else self._new(self.uop)

  # ---- changing a tensor's value
  def _write(self, value) -> TensorCore:
    """Give this tensor the value `value` (array-like of its shape), as torch's copy_ does, in a buffer of its own: the old
    one may be shared (realize's siblings, a detached view), and a uopc.jit replay reads the tensor's current buffer."""
    arr = np.asarray(value)
    if arr.shape != self.shape: raise TensorError(f"write: a value of shape {arr.shape} into a tensor of shape {self.shape}")
    return self.assign(type(self)(arr, dtype=self.dtype, device=self.device))

  def assign(self, other: TensorCore | Any) -> TensorCore:
    """Make this tensor hold `other`'s value (same shape, dtype and device), lazily: the tensor object stays the one
    everyone holds (an optimizer's parameter), its value is replaced."""
    other = other if isinstance(other, TensorCore) else type(self)(other, dtype=self.dtype, device=self.device)
    if other.shape != self.shape or other.dtype is not self.dtype:
      raise TensorError(f"assign: {other.dtype.name}{other.shape} into {self.dtype.name}{self.shape}")
    if other.device != self.device:
      raise TensorError(f"assign: a tensor on {other.device} into one on {self.device}: move it first (Tensor(x, device=...))")
    if (cap := capturing()) is not None: cap.assigned.append((self, self.uop))
    self.uop = other.uop
    if not is_realized(self.uop): mark_lazy(self)
    return self

  # ---- dtype and device
  def cast(self, dtype) -> TensorCore:
    if dtype is None: raise TensorError("cast needs a dtype, got None")
    d = to_dtype(dtype)
    return self if d is self.dtype else self._new(self.uop.cast(d))
  def float(self) -> TensorCore: return self.cast(dtypes.f32)
  def half(self) -> TensorCore: return self.cast(dtypes.f16)
  def int(self) -> TensorCore: return self.cast(dtypes.i32)
  def bool(self) -> TensorCore: return self.cast(dtypes.bool)
  def to(self, *args, device: str | None = None, dtype=None) -> TensorCore:
    """torch's Tensor.to: a backend's name moves the tensor there (`.to("PYTHON")`), a dtype casts (`.to(dtypes.f16)`,
    `.to("f16")`), a Tensor gives its device and dtype, and to(device, dtype) does both. A str names a dtype when it is
    one, else a backend ("unknown dtype 'PYTHON'" was the error: `to` was cast alone)."""
    if len(args) > 2: raise TensorError(f"to: takes a device, a dtype or a tensor (and dtype=, device=), got {len(args)} arguments")
    for a in args:
      if isinstance(a, TensorCore): device, dtype = device or a.device, dtype or a.dtype
      elif isinstance(a, str) and dtype is None and dtype_named(a) is not None: dtype = dtype_named(a)
      elif isinstance(a, str) and device is None: device = a
      elif a is None: raise TensorError("to: None is neither a device nor a dtype")
      elif dtype is None and not isinstance(a, str): dtype = a
      else: raise TensorError(f"to: {a!r} given with device={device!r} and dtype={dtype!r}: one device and one dtype at most")
    t = self.cast(dtype) if dtype is not None else self
    return t._moved(device) if device is not None else t
  def _moved(self, device: str) -> TensorCore:
    """The same value on the backend `device`: realized here, read back, and copied in there (no kernel runs across two
    backends). A tensor that requires a gradient isn't moved: its gradient can't flow back across backends."""
    if not isinstance(device, str): raise TensorError(f"to: a device is a backend's name (a str), got {device!r}")
    try: get_backend(device)
    except BackendError as e: raise TensorError(f"to: {device!r} is neither a dtype nor a backend ({e})") from None
    if device.strip().upper() == self.device: return self
    if self.requires_grad:
      raise TensorError(f"to({device!r}): this tensor requires a gradient, which can't flow back from another backend; copy "
                        f"the values alone with Tensor(t.numpy(), device={device!r}) (and requires_grad_() the copy there)")
    return type(self)(self.numpy(), dtype=self.dtype, device=device)

  # ---- broadcasting and promotion: how every binary op meets its operands
  def _scalar_dtype(self, v) -> DType:
    if isinstance(v, bool): return self.dtype
    if isinstance(v, float) and not self.dtype.is_float: return dtypes.f32
    if isinstance(v, int) and self.dtype is dtypes.bool: return dtypes.i32
    return self.dtype

  def _operands(self, other, reverse: bool = False) -> tuple[UOp, UOp, list[TensorCore]]:
    """Both operands as UOps of one shape and dtype: python scalars adopt this tensor's dtype, tensors promote."""
    if isinstance(other, TensorCore):
      a, b = self.uop, other.uop
      # the common case first (a graph's ops mostly meet operands of one shape and dtype): nothing to promote or broadcast
      if a.shape == b.shape and a.dtype is b.dtype: return (b, a, [self, other]) if reverse else (a, b, [self, other])
      if a.dtype is b.dtype:
        # one dtype, shapes that broadcast (a bias, a row statistic): the UOps _broadcast_to gives, without its Tensors
        shape = broadcast_shape(self.shape, other.shape)
        a, b = broadcast_uop(a, shape), broadcast_uop(b, shape)
        return (b, a, [self, other]) if reverse else (a, b, [self, other])
      d = promote(self.dtype, other.dtype)
      shape = broadcast_shape(self.shape, other.shape)
      a, b = self.cast(d)._broadcast_to(shape).uop, other.cast(d)._broadcast_to(shape).uop
      parents = [self, other]
    else:
      if isinstance(other, np.ndarray) or isinstance(other, (list, tuple)): return self._operands(type(self)(other, device=self.device), reverse)
      if not isinstance(other, (int, float, bool, np.number, np.bool_)): raise TensorError(f"can't combine a Tensor with {type(other).__name__}")
      other = other.item() if isinstance(other, (np.number, np.bool_)) else other
      d = self._scalar_dtype(other)
      if d is dtypes.i32 and isinstance(other, int) and not I32_MIN <= other <= I32_MAX:
        raise TensorError(f"the python int {other} doesn't fit the tensor's i32 (it would wrap); use a float or a smaller value")
      a = self.cast(d).uop
      b = a.const_like(other)
      parents = [self]
    return (b, a, parents) if reverse else (a, b, parents)

  def _broadcast_to(self, shape: tuple[int, ...]) -> TensorCore:
    """self broadcast to `shape` (NumPy's rule: ones prepended, then axes of 1 expanded), checked; broadcast_uop builds it."""
    if self.shape == shape: return self
    if len(shape) < self.ndim: raise TensorError(f"can't broadcast {self.shape} to {shape}")
    for a, b in zip((1,) * (len(shape) - self.ndim) + self.shape, shape):
      if a != b and a != 1: raise TensorError(f"can't broadcast {self.shape} to {shape}")
    return self._new(broadcast_uop(self.uop, shape))

  def _binop(self, op: Ops, other, reverse: bool = False) -> TensorCore:
    a, b, parents = self._operands(other, reverse)
    return self._new(UOp(op, (a, b)), *parents)

  # ---- gradients
  def backward(self, gradient: TensorCore | None = None) -> None:
    """Accumulate d self / d t into t.grad for every tensor t that requires a gradient and that self depends on."""
    if gradient is None and (self.numel() != 1 or not self.dtype.is_float):
      raise TensorError(f"backward() on a {self.dtype.name}{self.shape} tensor needs a gradient (only a float scalar defaults to 1)")
    if not self.requires_grad:   # torch refuses it too: there is no graph to go back through, so every gradient would be 0
      raise TensorError("backward(): nothing in this graph requires a gradient: this tensor was computed from tensors that "
                        "don't, detached, or returned by a uopc.jit replay (which keeps no graph: call backward() inside the function)")
    leaves = [t for t in grad_leaves() if t.requires_grad]
    root, order = self._seen_through(leaves)
    nodes = set(order)
    leaves = [t for t in leaves if t.uop in nodes]
    if not leaves: raise TensorError("backward(): nothing in this graph requires a gradient")
    for t, gt in zip(leaves, self._gradients(root, order, leaves, gradient)):
      t.grad = gt if t.grad is None else t.grad + gt
    if not is_realized(self.uop): _differentiated.add(self)


  def gradient(self, *targets: TensorCore, gradient: TensorCore | None = None) -> list[TensorCore]:
    """d self / d t for each target t, as new tensors (zeros for a target self doesn't depend on), without touching any
    .grad. The targets need not require gradients: this is tinygrad's Tensor.gradient (torch.autograd.grad). A value
    realized on the way is seen through only when it was computed from tensors that require gradients (realize keeps
    the graph of those alone); otherwise the realized value is a constant here."""
    if gradient is None and (self.numel() != 1 or not self.dtype.is_float):
      raise TensorError(f"gradient() of a {self.dtype.name}{self.shape} tensor needs a gradient (only a float scalar defaults to 1)")
    if not all(isinstance(t, TensorCore) for t in targets): raise TensorTypeError("gradient() takes the Tensors to differentiate by")
    return self._gradients(*self._seen_through(list(targets)), list(targets), gradient)

  def _seen_through(self, leaves: list[TensorCore]) -> tuple[UOp, list[UOp]]:
    """self's graph with values realized earlier (loss.item() before backward, ...) replaced by the graphs they came from,
    down to the leaves, and its nodes in topological order (sorting a training step's graph costs milliseconds: its
    users take this one)."""
    root = self.uop
    leaf_buffers = {buffer_uop(t.uop) for t in leaves}
    while True:
      order = root.toposort()
      if not (seen := {u: history[u] for u in order if u.op is Ops.BUFFER and u in history and u not in leaf_buffers}): return root, order
      root = root.substitute(seen)

  def _gradients(self, root: UOp, order: list[UOp], leaves: list[TensorCore], gradient: TensorCore | None) -> list[TensorCore]:
    seed = gradient.cast(self.dtype).uop if gradient is not None else root.const_like(1.0)
    if seed.shape != self.shape: raise TensorError(f"backward: gradient {seed.shape} for a tensor of shape {self.shape}")
    # a GATHER's adjoint compares its indices with 0..n-1, a shared stored arange (the composed Tensor's creation methods)
    grads = grad_of(root, [t.uop for t in leaves], seed, order=order, positions=getattr(self, "_positions_uop", None))
    return [type(self)(g if g.dtype is t.dtype else g.cast(t.dtype), device=self.device) for t, g in zip(leaves, grads)]

  def _with_gradient(self, *pairs: tuple[TensorCore, TensorCore]) -> TensorCore:
    """self's value, whose gradient with respect to each x of `pairs` is the paired slope (d self / d x, of self's shape)
    instead of what differentiating self's graph would give. For ops whose PyTorch gradient is a formula of its own at the
    edges (pow at 0 and at infinity, erf): value and slope are computed robustly apart and joined as v + (x - x') * slope,
    x' being x detached: exactly v forward, the slope backward. 0 * slope would be NaN forward for an infinite slope, so
    that goes in as (x - x') * big * big (forward 0, gradient g * big * big = inf for any g above 2^-126), and a NaN slope
    as the difference of two such products (gradient inf - inf). At an infinite x, x - x' is NaN, so there the gradient
    is 0 (where torch's formula may give inf: b ** 3.3 at b = inf): no graph of x has a finite forward value and an
    infinite slope there. Where x is NaN and so is the value, the gradient is NaN, as torch's (a NaN must not vanish in
    the backward pass): a term NaN there and +0.0 elsewhere, subtracted so a -0.0 value keeps its sign."""
    # no gradient can flow into an x that requires none (requires_grad is set as the graph is built): the value alone,
    # without the slope's graph, which a forward pass would otherwise evaluate (times 0) in every kernel
    if not any(x.requires_grad for x, _ in pairs): return self._stop_gradient()
    out = self._stop_gradient()
    big = 2.0 ** (127 if out.dtype is dtypes.f32 else 15)
    value_nan = out.isnan()
    for x, slope in pairs:
      xn = x._stop_gradient().isnan() & value_nan
      out = out - (xn.where(x, 0.0) - xn.where(x._stop_gradient(), 0.0)) * xn.where(math.nan, 0.0)
      xd, slope = x._stop_gradient(), slope._stop_gradient()
      finite = xd.isfinite()
      z = (finite.where(x, 0.0) - finite.where(xd, 0.0))._broadcast_to(out.shape)   # 0, with slope 1 in x where x is finite
      inf, nan = slope.isinf(), slope.isnan()
      out = out + z * (inf | nan).where(0.0, slope)
      out = out + (inf.where(z * slope.sign(), 0.0) * big) * big
      zn = nan.where(z, 0.0)
      out = out + ((zn * big) * big - ((zn * 2.0) * big) * (big / 2))
    return out
