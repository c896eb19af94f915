"""uopc.nn.state: naming a model's tensors (state dicts) and moving them in and out of safetensors files.

`get_state_dict(obj)` walks attributes, lists, tuples and dicts and names each Tensor by its dotted path
(`layers.0.weight`); `load_state_dict` checks names and shapes before copying anything in. `safe_save` and
`safe_load` write and read the safetensors format (an 8-byte little-endian header length, a JSON header of
dtype/shape/data_offsets per tensor, then the raw little-endian data), with NumPy and json alone, so the files
interchange with the `safetensors` library.
"""
from __future__ import annotations
import json, math, os, stat, struct
from pathlib import Path
from typing import Any
import numpy as np
from uopc.compile_cache import write_file
from uopc.tensor import Tensor, TensorError


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
  def write(f) -> None:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for b in blobs: f.write(b)
  try: write_file(path, write)   # atomic and durable: a temporary beside it, synced, renamed, the directory synced
  except OSError as e: raise SafetensorsError(f"{path}: can't write it ({e.strerror or e})") from None


def _file_path(path, what: str) -> Path:
  """A file name given as a str or a Path (a NUL in it was a raw ValueError, a number a raw TypeError)."""
  if not isinstance(path, (str, os.PathLike)) or "\0" in os.fspath(path):
    raise SafetensorsError(f"{what}: a file name is a str or a Path without NUL characters, got {path!r:.80}")
  return Path(path)


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
