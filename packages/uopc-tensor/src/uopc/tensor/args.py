"""uopc.tensor.args: the checks every Tensor method puts its arguments through, and the dtype rules.

Arguments are checked where they come in, before any graph is built, so a mistake is a TensorError that names the
value and what was expected rather than an error from deep in the IR (or a silently truncated float): sizes and
dimensions are ints, a tensor stays within the i32 index limit (check_size), window arguments are at least 1. The
dtype rules: dtypes promote bool < i32 < f16 < f32 (promote), NumPy's dtypes map onto these four (NP_TO_DTYPE,
float64 and int64 narrowed as torch's default dtypes are), and shapes broadcast as NumPy's do (broadcast_shape).
"""
from __future__ import annotations
import operator
import numpy as np
from uopc.dtype import DType, dtypes, I32_MAX
from uopc.uop import prod
from uopc.tensor.errors import TensorError, TensorIndexError, TensorTypeError

_PROMOTION = (dtypes.bool, dtypes.i32, dtypes.f16, dtypes.f32)
NP_TO_DTYPE = {np.dtype(np.float32): dtypes.f32, np.dtype(np.float64): dtypes.f32, np.dtype(np.float16): dtypes.f16,
               np.dtype(np.int32): dtypes.i32, np.dtype(np.int64): dtypes.i32, np.dtype(np.int16): dtypes.i32,
               np.dtype(np.int8): dtypes.i32, np.dtype(np.uint8): dtypes.i32, np.dtype(np.uint16): dtypes.i32,
               np.dtype(np.bool_): dtypes.bool}


def to_dtype(d) -> DType:
  """The dtype `d` names: a DType, a name ("f16", "float32", "half"), a Python type (float, int, bool) or a NumPy dtype;
  None stays None (no dtype asked for)."""
  if d is None or isinstance(d, DType): return d
  if isinstance(d, str):
    try: return dtypes.from_name({"float32": "f32", "float": "f32", "int32": "i32", "int": "i32", "float16": "f16", "half": "f16"}.get(d, d))
    except ValueError as e: raise TensorError(str(e)) from None
  if d is float: return dtypes.f32
  if d is int: return dtypes.i32
  if d is bool: return dtypes.bool
  try: return NP_TO_DTYPE[np.dtype(d)]
  except (TypeError, KeyError, ValueError): raise TensorError(f"unknown dtype {d!r}") from None


def dtype_named(name: str) -> DType | None:
  """The dtype a string names ("f16", "float32", "half"), or None when it names none (a device, then)."""
  try: return to_dtype(name)
  except TensorError: return None


def int_arg(v, what: str) -> int:
  """An argument that must be an integer (a dimension, a count): a float, a string or an array is a TensorError."""
  if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)): raise TensorError(f"{what} must be an int, got {v!r}")
  return int(v)


def number_arg(v, what: str) -> float:
  """An argument that must be a real number (a probability, an exponent, a bound)."""
  if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
    raise TensorError(f"{what} must be a number, got {v!r}")
  return v


def shape_arg(shape) -> tuple[int, ...]:
  """Sizes given as ints or as one tuple or list of them (zeros(2, 3) and zeros((2, 3))), each an integer."""
  if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = shape[0]
  try: return tuple(operator.index(s) for s in shape)   # int(2.7) would make Tensor.zeros(2.7) silently (2,)
  except TypeError: raise TensorError(f"sizes and dimensions are integers, got {tuple(shape)!r}") from None


def check_size(shape: tuple[int, ...], what: str) -> tuple[int, ...]:
  """Every element of a tensor is addressed by an i32 index: refuse a shape past that when the tensor is made, naming it
  (rather than with an i32 CONST error at realize, or after minutes of looping over 2**40 elements)."""
  if (n := prod(shape)) > I32_MAX:
    raise TensorError(f"{what}: a tensor of shape {shape} has {n} elements, more than the {I32_MAX} an i32 index can reach")
  return shape


def new_shape(shape, what: str) -> tuple[int, ...]:
  """The shape of a tensor being created: integers, none negative, within the index limit."""
  shape = shape_arg(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,))
  if any(s < 0 for s in shape): raise TensorError(f"{what}: sizes can't be negative, got {shape}")
  return check_size(shape, what)


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
  """NumPy's broadcast of the shapes (aligned on the right, size 1 stretches), or a TensorError naming them."""
  if all(s == shapes[0] for s in shapes): return tuple(shapes[0])
  n = max(len(s) for s in shapes)
  padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
  out = []
  for dims in zip(*padded):
    big = {d for d in dims if d != 1}
    if len(big) > 1: raise TensorError(f"can't broadcast shapes {' and '.join(str(tuple(s)) for s in shapes)}")
    out.append(big.pop() if big else 1)
  # a broadcast that makes something bigger than every operand is a new tensor (matmul's product of two equal shapes isn't)
  if prod(out) > max(prod(s) for s in shapes): check_size(tuple(out), f"broadcasting {' and '.join(str(tuple(s)) for s in shapes)}")
  return tuple(out)


def pairs_arg(arg, ndim: int, what: str) -> tuple[tuple[int, int] | None, ...]:
  """One (a, b) pair of ints or None per axis (pad's widths, shrink's ranges)."""
  if not isinstance(arg, (tuple, list)) or len(arg) != ndim:
    raise TensorError(f"{what}: expected {ndim} pairs (or None), one per axis, got {arg!r}")
  out = []
  for a in arg:
    if a is not None and (not isinstance(a, (tuple, list)) or len(a) != 2): raise TensorError(f"{what}: {a!r} is not a pair of ints or None")
    out.append(None if a is None else (int_arg(a[0], what), int_arg(a[1], what)))
  return tuple(out)


def per_axis(v, nd: int, what: str) -> tuple[int, ...]:
  """An argument per spatial axis (stride, dilation, ...) given as one int or nd of them."""
  if isinstance(v, (int, np.integer)): return (int(v),) * nd
  v = tuple(v)
  if len(v) != nd: raise TensorError(f"{what}: expected an int or {nd} ints, got {v}")
  return v


def padding_pairs(padding, nd: int, kernel, dilation, what: str) -> tuple[tuple[int, int], ...]:
  """(before, after) per spatial axis from an int, one int per axis, F.pad's flat tuple (last axis first), or 'valid' /
  'same' (torch's: the odd one out of an even window goes after)."""
  if isinstance(padding, str):
    if padding == "valid": return ((0, 0),) * nd
    if padding == "same": return tuple((d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(kernel, dilation))
    raise TensorTypeError(f"{what}: padding must be a number, numbers, 'same' or 'valid', got {padding!r}")
  ints = (padding,) if not isinstance(padding, (tuple, list)) else tuple(padding)
  if not all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in ints):
    raise TensorError(f"{what}: padding must be an int, a tuple of ints, 'same' or 'valid', got {padding!r}")
  if isinstance(padding, (int, np.integer)): return ((int(padding), int(padding)),) * nd
  padding = tuple(int(p) for p in padding)
  if len(padding) == nd: return tuple((p, p) for p in padding)
  if len(padding) == 2 * nd: return tuple((padding[2 * k], padding[2 * k + 1]) for k in reversed(range(nd)))
  raise TensorError(f"{what}: padding {padding} for {nd} spatial axes: expected an int, {nd} ints or {2 * nd} (before, after, last axis first)")


def check_window_args(what: str, **args) -> None:
  """kernel_size, stride, dilation and groups are at least 1 and (output_)padding at least 0, each an int or (groups excepted) a
  tuple of ints (one per spatial axis; padding may also be F.pad's flat tuple or a string, which padding_pairs reads): a 0
  was a ZeroDivisionError, a float a silently truncated size."""
  for name, v in args.items():
    if name == "padding" and isinstance(v, str): continue
    least = 0 if name in ("padding", "output_padding") else 1
    vals = (v,) if not isinstance(v, (tuple, list)) or name == "groups" else tuple(v)
    if not vals or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= least for x in vals):
      raise TensorError(f"{what}: {name} must be {'an int' if name == 'groups' else 'an int or a tuple of ints'} of at least {least}, got {v!r}")


def promote(*ds: DType) -> DType:
  """The dtype two or more operands meet in: the highest of bool < i32 < f16 < f32."""
  return max(ds, key=_PROMOTION.index)


def index_array(i) -> np.ndarray:
  """A list, tuple or array used as an index, as an array of i32 indices (a bool or float one is refused)."""
  try: arr = np.asarray(i)
  except ValueError: raise TensorIndexError(f"can't index with the ragged sequence {i!r}") from None
  if arr.size == 0: return arr.astype(np.int32)   # [] is a float array to numpy, an empty index to everyone
  if arr.dtype == bool: raise TensorIndexError("boolean mask indexing isn't supported (its result shape depends on the data; see masked_select)")
  if arr.dtype.kind not in "iu": raise TensorIndexError(f"indices must be integers, got {arr.dtype} {str(i)[:60]}")
  return arr.astype(np.int32)
