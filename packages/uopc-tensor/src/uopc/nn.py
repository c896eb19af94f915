"""nn: layers, optimizers and state dicts on top of Tensor.

Layers are plain objects whose Tensor attributes are their parameters (PyTorch's layouts and initializations:
Linear's weight is (out, in), Conv2d's (out, in/groups, kh, kw)); calling one runs its forward. An optimizer
holds a list of parameters; `step()` computes every update lazily and realizes them in one schedule, so the
kernels of all parameters (and the forward work they share) run together, and `zero_grad()` clears the grads.

State: `get_state_dict(obj)` walks attributes, lists, tuples and dicts and names each Tensor by its dotted path
(`layers.0.weight`); `load_state_dict` checks names and shapes before copying anything in. `safe_save` and
`safe_load` write and read the safetensors format (an 8-byte little-endian header length, a JSON header of
dtype/shape/data_offsets per tensor, then the raw little-endian data), with NumPy and json alone, so the files
interchange with the `safetensors` library.
"""
from __future__ import annotations
import json, math, os, stat, struct, tempfile, warnings
from pathlib import Path
from typing import Any
import numpy as np
from uopc.tensor import Tensor, TensorError, _check_window_args


def _sizes(layer: str, **sizes) -> None:
  """A layer's sizes are non-negative ints (a negative one gave "math domain error" from the initializer's square root)."""
  for name, v in sizes.items():
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
      raise TensorError(f"{layer}: {name} must be a non-negative int, got {v!r}")


def _kaiming_uniform(shape: tuple[int, ...], fan_in: int) -> Tensor:
  bound = 1 / math.sqrt(fan_in) if fan_in else 0.0
  return Tensor.uniform(*shape, low=-bound, high=bound, requires_grad=True)


class Linear:
  """y = x @ weight.T + bias, weight (out_features, in_features), both initialized U(-1/sqrt(in), 1/sqrt(in)) as in torch."""
  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    _sizes("Linear", in_features=in_features, out_features=out_features)
    self.weight = _kaiming_uniform((out_features, in_features), in_features)
    self.bias = _kaiming_uniform((out_features,), in_features) if bias else None
  def __call__(self, x: Tensor) -> Tensor: return x.linear(self.weight, self.bias)


class Embedding:
  """Rows of weight (num_embeddings, embedding_dim), initialized N(0, 1), picked by integer indices."""
  def __init__(self, num_embeddings: int, embedding_dim: int):
    _sizes("Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
    self.weight = Tensor.randn(num_embeddings, embedding_dim, requires_grad=True)
  def __call__(self, idx: Tensor) -> Tensor: return idx.embedding(self.weight)


class LayerNorm:
  """layernorm over the last len(normalized_shape) axes, then * weight + bias (ones and zeros at first)."""
  def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5, elementwise_affine: bool = True):
    if not isinstance(normalized_shape, (int, tuple, list)):
      raise TensorError(f"LayerNorm: normalized_shape must be an int or a tuple of ints, got {normalized_shape!r}")
    self.shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    _sizes("LayerNorm", **{f"normalized_shape[{i}]": n for i, n in enumerate(self.shape)})
    self.eps = _hyper("eps", eps)
    self.weight = Tensor.ones(*self.shape, requires_grad=True) if elementwise_affine else None
    self.bias = Tensor.zeros(*self.shape, requires_grad=True) if elementwise_affine else None
  def __call__(self, x: Tensor) -> Tensor:
    if x.shape[-len(self.shape):] != self.shape: raise TensorError(f"LayerNorm{self.shape} applied to a tensor of shape {x.shape}")
    y = x.layernorm(tuple(range(-len(self.shape), 0)), self.eps)
    return y * self.weight + self.bias if self.weight is not None else y


class Conv2d:
  """torch.nn.Conv2d: weight (out, in/groups, kh, kw) and bias initialized U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int], stride=1, padding=0, dilation=1,
               groups: int = 1, bias: bool = True):
    _sizes("Conv2d", in_channels=in_channels, out_channels=out_channels)
    _check_window_args("Conv2d", kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation, groups=groups)
    kh, kw = (kernel_size, kernel_size) if not isinstance(kernel_size, (tuple, list)) else kernel_size
    if in_channels % groups or out_channels % groups:
      raise TensorError(f"Conv2d: channels {in_channels}->{out_channels} not divisible by groups={groups}")
    self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
    fan_in = in_channels // groups * kh * kw
    self.weight = _kaiming_uniform((out_channels, in_channels // groups, kh, kw), fan_in)
    self.bias = _kaiming_uniform((out_channels,), fan_in) if bias else None
  def __call__(self, x: Tensor) -> Tensor:
    return x.conv2d(self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Dropout:
  """Zero each element with probability p while `training`, scaling the rest by 1/(1-p)."""
  def __init__(self, p: float = 0.5):
    self.p, self.training = p, True
  def __call__(self, x: Tensor) -> Tensor: return x.dropout(self.p, self.training)


# ---- optimizers ------------------------------------------------------------------------------------------------------

class Optimizer:
  """The parameters and the state of an optimizer are Tensors updated with assign: every step is the same graph over the
  same tensors, so it compiles once, and uopc.jit can capture a whole training step and replay it. Scalars that change
  from step to step (the learning rate, Adam's bias corrections) are state tensors too, never python constants baked
  into a kernel (a new constant is a new kernel structure: a compile every step, and a frozen value in a replay)."""
  def __init__(self, params: list[Tensor], lr: float):
    if isinstance(params, Tensor) or not hasattr(params, "__iter__"):
      raise TensorError(f"an optimizer takes a list of parameters (Tensors), got {type(params).__name__}")
    _hyper("lr", lr)
    self.params = list(params)
    if not self.params: raise TensorError("an optimizer needs at least one parameter")
    for p in self.params:
      if not isinstance(p, Tensor): raise TensorError(f"optimizer parameters must be Tensors, got {type(p).__name__}")
      if not p.requires_grad: p.requires_grad_(True)
    if len({id(p) for p in self.params}) != len(self.params):   # each copy would be stepped: twice the update (torch warns too)
      warnings.warn("optimizer: a parameter is given more than once, so each step updates it once per copy", UserWarning, stacklevel=3)
    self._lr = self._scalar(lr)

  @property
  def lr(self) -> float: return float(self._lr.item())
  @lr.setter
  def lr(self, value: float) -> None: self._lr._write(np.full(self._lr.shape, _hyper("lr", value), np.float32))   # in place: a jit sees it

  def zero_grad(self) -> None:
    for p in self.params: p.grad = None

  def step(self) -> None:
    """Apply one update to every parameter with a gradient, all realized in one schedule."""
    if ts := self.update(): ts[0].realize(*ts[1:])

  def update(self) -> list[Tensor]:
    """Give every parameter with a gradient its updated value, lazily (nothing runs), and return the tensors a step
    realizes: the parameters and the optimizer's state. step() is update() and one realize."""
    todo = [(i, p) for i, p in enumerate(self.params) if p.grad is not None]
    if not todo: return []
    state = self._step_state()
    for i, p in todo:
      value, own = self._update(i, p, p.grad._stop_gradient())
      p.assign(value.cast(p.dtype))
      state += own
    return [p for _, p in todo] + state

  def _step_state(self) -> list[Tensor]: return []
  def _update(self, i: int, p: Tensor, g: Tensor) -> tuple[Tensor, list[Tensor]]:
    raise NotImplementedError

  def _scalar(self, v: float) -> Tensor: return Tensor(np.array(v, dtype=np.float32), device=self.params[0].device)
  def _zeros(self) -> list[Tensor]: return [Tensor.zeros(*p.shape, device=p.device).realize() for p in self.params]


def _hyper(name: str, v, low: float = 0.0, high: float = math.inf) -> float:
  """A hyperparameter: a number in [low, high) (torch refuses a negative learning rate, a beta of 1, ...)."""
  if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not low <= v < high:
    raise TensorError(f"{name} must be a number in [{low}, {high}), got {v!r}")
  return float(v)


class SGD(Optimizer):
  """p -= lr * v, with v = momentum * v + (g + weight_decay * p) (torch's SGD, nesterov optional)."""
  def __init__(self, params: list[Tensor], lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False):
    super().__init__(params, lr)
    self.momentum, self.weight_decay, self.nesterov = _hyper("momentum", momentum), _hyper("weight_decay", weight_decay), nesterov
    self.buf = self._zeros() if momentum else []          # torch's first step sets v = g, which is 0 * momentum + g

  def _update(self, i, p, g):
    if self.weight_decay: g = g + self.weight_decay * p._stop_gradient()
    state = []
    if self.momentum:
      v = self.buf[i].assign(self.buf[i] * self.momentum + g)
      state.append(v)
      g = g + self.momentum * v if self.nesterov else v
    return p._stop_gradient() - self._lr * g, state


class Adam(Optimizer):
  """Adam (weight_decay adds weight_decay * p to the gradient, as torch's Adam); AdamW decays the weights directly.
  The bias corrections 1/(1 - b**t) come from state kept as 1 - b**t, updated as s*b + (1 - b): no cancellation in
  1 - 0.999**t for small t, as computing b**t in f32 would give."""
  decoupled = False

  def __init__(self, params: list[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.0):
    super().__init__(params, lr)
    if not isinstance(betas, (tuple, list)) or len(betas) != 2: raise TensorError(f"betas must be a pair of numbers, got {betas!r}")
    self.b1, self.b2 = _hyper("betas[0]", betas[0], 0.0, 1.0), _hyper("betas[1]", betas[1], 0.0, 1.0)
    self.eps, self.weight_decay = _hyper("eps", eps), _hyper("weight_decay", weight_decay)
    self.t = 0
    self.m, self.v = self._zeros(), self._zeros()
    self._s1, self._s2 = self._scalar(0.0), self._scalar(0.0)       # 1 - b1**t and 1 - b2**t

  def _step_state(self) -> list[Tensor]:
    self.t += 1
    self._s1.assign(self._s1 * self.b1 + (1 - self.b1))
    self._s2.assign(self._s2 * self.b2 + (1 - self.b2))
    return [self._s1, self._s2]

  def _update(self, i, p, g):
    w = p._stop_gradient()
    if self.weight_decay and not self.decoupled: g = g + self.weight_decay * w
    if self.weight_decay and self.decoupled: w = w * (1 - self._lr * self.weight_decay)
    m = self.m[i].assign(self.m[i] * self.b1 + g * (1 - self.b1))
    v = self.v[i].assign(self.v[i] * self.b2 + g * g * (1 - self.b2))
    mhat, vhat = m / self._s1, v / self._s2
    return w - self._lr * mhat / (vhat.sqrt() + self.eps), [m, v]


class AdamW(Adam):
  """Adam with decoupled weight decay: p *= 1 - lr * weight_decay before the Adam step (torch's AdamW, default 0.01)."""
  decoupled = True

  def __init__(self, params: list[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.01):
    super().__init__(params, lr, betas, eps, weight_decay)   # (checked by Adam)


# ---- state dicts and safetensors ----------------------------------------------------------------------------------------

def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
  """Every Tensor reachable from obj through attributes, lists, tuples and dicts, named by its dotted path."""
  out: dict[str, Tensor] = {}
  stack: list[tuple[str, Any]] = [(prefix.rstrip("."), obj)]
  seen: set[int] = set()
  while stack:
    name, o = stack.pop()
    if isinstance(o, Tensor): out[name] = o; continue
    if id(o) in seen: continue
    seen.add(id(o))
    if isinstance(o, dict): items = [(str(k), v) for k, v in o.items()]
    elif isinstance(o, (list, tuple)): items = [(str(k), v) for k, v in enumerate(o)]
    elif hasattr(o, "__dict__") and not isinstance(o, type): items = list(vars(o).items())
    else: continue
    for k, v in reversed(items): stack.append((f"{name}.{k}" if name else k, v))
  return out


def load_state_dict(obj: Any, state: dict[str, Tensor | np.ndarray], strict: bool = True) -> None:
  """Copy `state` into obj's tensors (by get_state_dict name). Missing or unexpected names (when strict) and shape
  mismatches are errors, and nothing is changed unless everything fits."""
  if not isinstance(state, dict): raise TensorError(f"load_state_dict takes a dict of name -> Tensor, got {type(state).__name__}")
  own = get_state_dict(obj)
  missing, unexpected = sorted(set(own) - set(state)), sorted(map(str, set(state) - set(own)))
  if strict and (missing or unexpected):
    raise TensorError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
  state = {k: _state_value(k, v) for k, v in state.items() if k in own}
  for k in set(own) & set(state):
    shape = tuple(state[k].shape)
    if shape != own[k].shape: raise TensorError(f"load_state_dict: {k} has shape {shape} in the state but {own[k].shape} in the model")
  for k in set(own) & set(state):
    v = state[k]
    arr = v.numpy() if isinstance(v, Tensor) else np.asarray(v)
    own[k]._write(arr)          # in place, as torch's load_state_dict copies: views and jit captures see the new values


def _state_value(name: str, v) -> Tensor | np.ndarray:
  """A state entry as a Tensor or a numeric array (a list, a number); anything else is named in a TensorError."""
  if isinstance(v, Tensor): return v
  try: arr = np.asarray(v)
  except (ValueError, TypeError): arr = None
  if arr is None or arr.dtype.kind not in "biuf":
    raise TensorError(f"load_state_dict: {name} is a {type(v).__name__}, not a Tensor or an array of numbers")
  return arr


_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "BOOL": np.bool_, "F64": np.float64, "I64": np.int64}
_ST_NAMES = {np.dtype(v): k for k, v in _ST_DTYPES.items()}


class SafetensorsError(ValueError):
  """A file that isn't valid safetensors, or that can't be read or written."""


def safe_save(state: dict[str, Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
  """Write tensors to a .safetensors file (readable by the safetensors library). The file is written beside `path`
  under a unique temporary name, flushed to disk and renamed into place: a reader (or a crash) sees the old file or
  the whole new one, two processes saving to one path each write their own temporary, and a failure removes it."""
  if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
    raise TensorError(f"safe_save takes a dict of name (a str) -> Tensor, got {type(state).__name__}")
  path = _file_path(path, "safe_save")
  header: dict[str, Any] = {}
  blobs, off = [], 0
  for name in sorted(state):
    t = state[name]
    if name == "__metadata__": raise TensorError("safe_save: __metadata__ is the format's own key; pass metadata= instead")
    try: arr = np.asarray(t.numpy() if isinstance(t, Tensor) else t, order="C")   # np.ascontiguousarray would make a scalar 1-d
    except (ValueError, TypeError, RecursionError): raise TensorError(f"safe_save: {name} is ragged or not numbers") from None
    if arr.dtype not in _ST_NAMES: raise TensorError(f"safe_save: {name} has dtype {arr.dtype}, which safetensors can't hold here")
    data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    header[name] = {"dtype": _ST_NAMES[arr.dtype], "shape": list(arr.shape), "data_offsets": [off, off + len(data)]}
    blobs.append(data)
    off += len(data)
  if metadata is not None and not isinstance(metadata, dict): raise TensorError(f"safe_save: metadata must be a dict, got {type(metadata).__name__}")
  if metadata: header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
  h = json.dumps(header, separators=(",", ":")).encode()
  h += b" " * (-len(h) % 8)   # the data starts 8-byte aligned
  path = Path(os.path.realpath(path))   # through a symlink to its target, which the rename then replaces
  try: fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  except OSError as e: raise SafetensorsError(f"{path}: can't write it ({e.strerror or e})") from None
  try:
    with os.fdopen(fd, "wb") as f:
      try: os.fchmod(f.fileno(), 0o666 & ~_umask())   # the mode open() would give (mkstemp's is 0600)
      except OSError: pass                             # a filesystem without modes (vfat, some mounts) keeps its own
      f.write(struct.pack("<Q", len(h)))
      f.write(h)
      for b in blobs: f.write(b)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)                       # the rename itself survives a crash too
  except BaseException as e:
    try: os.unlink(tmp)
    except OSError: pass
    if isinstance(e, OSError): raise SafetensorsError(f"{path}: can't write it ({e.strerror or e})") from None
    raise


def _file_path(path, what: str) -> Path:
  """A file name given as a str or a Path (a NUL in it was a raw ValueError, a number a raw TypeError)."""
  if not isinstance(path, (str, os.PathLike)) or "\0" in os.fspath(path):
    raise SafetensorsError(f"{what}: a file name is a str or a Path without NUL characters, got {path!r:.80}")
  return Path(path)


def _umask() -> int:
  try:
    with open("/proc/self/status") as f: return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
  except (OSError, StopIteration, ValueError, IndexError): return 0o022


def _fsync_dir(d: Path) -> None:
  try:
    fd = os.open(d, os.O_RDONLY)
    try: os.fsync(fd)
    finally: os.close(fd)
  except OSError: pass   # some filesystems can't sync a directory; the data itself is synced


def _entry(path, name: str, info) -> tuple[np.dtype, tuple[int, ...], int, int]:
  """(dtype, shape, begin, end) of one header entry, each checked: a JSON list of non-negative ints for the shape, two
  ints for the offsets (a string offset or a negative size was a raw NumPy error)."""
  if not isinstance(info, dict): raise SafetensorsError(f"{path}: entry {name!r} is {type(info).__name__}, not a JSON object")
  dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
  if not isinstance(dtype, str) or dtype not in _ST_DTYPES:
    raise SafetensorsError(f"{path}: entry {name!r} has dtype {dtype!r}; uopc reads {', '.join(_ST_DTYPES)}")
  is_int = lambda v: type(v) is int
  if not isinstance(shape, list) or not all(is_int(s) and s >= 0 for s in shape) or len(shape) > 32:
    raise SafetensorsError(f"{path}: entry {name!r} has shape {shape!r:.80}; a shape is a list of non-negative integers (at most 32)")
  if math.prod(shape) > 2**31 - 1 or any(s > 2**31 - 1 for s in shape):
    raise SafetensorsError(f"{path}: entry {name!r} of shape {shape!r:.80} is past the 2147483647 elements an i32 index can reach")
  if not isinstance(offsets, list) or len(offsets) != 2 or not all(is_int(o) for o in offsets):
    raise SafetensorsError(f"{path}: entry {name!r} has data_offsets {offsets!r}; they are two integers [begin, end]")
  return np.dtype(_ST_DTYPES[dtype]), tuple(shape), offsets[0], offsets[1]


def safe_load(path: str | Path, with_metadata: bool = False) -> dict[str, Tensor] | tuple[dict[str, Tensor], dict[str, str]]:
  """Read a .safetensors file into Tensors (and its metadata, with_metadata=True); a malformed file is a
  SafetensorsError that says what is wrong."""
  path = _file_path(path, "safe_load")
  try:
    with open(path, "rb") as f:
      st = os.fstat(f.fileno())
      if not stat.S_ISREG(st.st_mode): raise SafetensorsError(f"{path}: not a regular file")
      if st.st_size < 8: raise SafetensorsError(f"{path}: too short to be a safetensors file ({st.st_size} bytes)")
      (n,) = struct.unpack("<Q", f.read(8))
      if n > st.st_size - 8: raise SafetensorsError(f"{path}: the header claims {n} bytes but the file has {st.st_size - 8} after the length")
      head = f.read(n)
      # the data is read only up to the last byte an entry uses (checked against the header before any of it is read)
      try: header = json.loads(head)
      except ValueError as e: raise SafetensorsError(f"{path}: the header is not valid JSON ({str(e)[:200]})") from None
      if isinstance(header, dict):
        end = 0
        for name, info in header.items():
          if name == "__metadata__": continue
          _, shape, b, e = _entry(path, name, info)
          if e > st.st_size - 8 - n:
            raise SafetensorsError(f"{path}: entry {name!r} has data_offsets {[b, e]} that don't fit its shape {shape} and dtype, or the "
                                   f"file ({st.st_size - 8 - n} bytes of data)")
          end = max(end, e)
        raw = f.read(end)
  except OSError as e: raise SafetensorsError(f"{path}: can't read it ({e.strerror or e})") from None
  except RecursionError: raise SafetensorsError(f"{path}: the header nests too deeply to be a safetensors header") from None
  if not isinstance(header, dict): raise SafetensorsError(f"{path}: the header is not a JSON object")
  data = memoryview(raw)
  out: dict[str, Tensor] = {}
  for name, info in header.items():
    if name == "__metadata__": continue
    dt, shape, b, e = _entry(path, name, info)
    if not 0 <= b <= e <= len(data) or e - b != math.prod(shape) * dt.itemsize:
      raise SafetensorsError(f"{path}: entry {name!r} has data_offsets {[b, e]} that don't fit its shape {shape} and dtype, or the file")
    arr = np.frombuffer(data[b:e], dtype=dt.newbyteorder("<")).reshape(shape).astype(dt)
    if arr.dtype == np.int64:   # held as i32, like Tensor(): a value past i32 would wrap (2**40 became 0)
      if arr.size and (arr.min() < -2**31 or arr.max() > 2**31 - 1):
        raise SafetensorsError(f"{path}: entry {name!r} holds I64 values outside i32 (from {arr.min()} to {arr.max()}), which uopc can't hold")
      arr = arr.astype(np.int32)
    if arr.dtype == np.float64:
      with np.errstate(over="ignore"): arr = arr.astype(np.float32)   # rounded to f32, as Tensor() does: past it, inf
    try: out[name] = Tensor(arr)
    except TensorError as ex: raise SafetensorsError(f"{path}: entry {name!r}: {ex}") from None
  if not with_metadata: return out
  meta = header.get("__metadata__", {})
  if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
    raise SafetensorsError(f"{path}: __metadata__ must map strings to strings")
  return out, meta


__all__ = ["Linear", "Embedding", "LayerNorm", "Conv2d", "Dropout", "Optimizer", "SGD", "Adam", "AdamW", "get_state_dict",
           "load_state_dict", "safe_save", "safe_load", "SafetensorsError"]
