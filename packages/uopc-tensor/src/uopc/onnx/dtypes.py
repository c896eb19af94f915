"""uopc.onnx.dtypes: ONNX's element types on uopc's four, and the way values cross between them.

uopc computes in bool, i32, f16 and f32. An ONNX value of another type is computed in the nearest of them and keeps
its declared type beside it (the graph's, from ONNX's type inference):

    declared                                 computed in   what keeps the declared type's meaning
    float32, float64                         f32           float64 values past f32's range are refused on the way in
    float16                                  f16           -
    int32                                    i32           i32 wraps as int32 does (two's complement)
    int8, int16, uint8, uint16               i32           `wrap` after arithmetic: the value modulo 2**bits, as ONNX's
    int64, uint32, uint64                    i32           every value must fit i32: refused on the way in, and the
                                                           arithmetic that could leave it is checked (`check_fits`)
    bool                                     bool          -

Values leave as NumPy arrays of the declared type (`to_numpy`). The other ONNX types (strings, bfloat16, the float8,
int4 and float4 families, complex numbers) raise NotImplementedError naming the type: a value uopc can't hold is never
approximated.
"""
from __future__ import annotations
import numpy as np
from onnx import TensorProto, helper
from uopc.dtype import DType, dtypes, I32_MIN, I32_MAX
from uopc.tensor import Tensor, TensorError
from uopc.tensor.capture import check_indices
from uopc.runtime import np_dtype


class OnnxError(TensorError):
  """A model, an input or a value uopc.onnx refuses: a malformed graph, an input of the wrong shape or type, a value that
  doesn't fit the type uopc computes it in. (An op or type uopc doesn't implement is a NotImplementedError.)"""


# the declared types uopc computes, each with the dtype it computes in
COMPUTE = {np.dtype(np.float32): dtypes.f32, np.dtype(np.float64): dtypes.f32, np.dtype(np.float16): dtypes.f16,
           np.dtype(np.int32): dtypes.i32, np.dtype(np.int64): dtypes.i32, np.dtype(np.int8): dtypes.i32, np.dtype(np.int16): dtypes.i32,
           np.dtype(np.uint8): dtypes.i32, np.dtype(np.uint16): dtypes.i32, np.dtype(np.uint32): dtypes.i32,
           np.dtype(np.uint64): dtypes.i32, np.dtype(np.bool_): dtypes.bool}
NARROW = {np.dtype(t): (int(np.iinfo(t).min), int(np.iinfo(t).max)) for t in (np.int8, np.int16, np.uint8, np.uint16)}   # wrapped
WIDE = {np.dtype(np.int64): (I32_MIN, I32_MAX), np.dtype(np.uint32): (0, I32_MAX), np.dtype(np.uint64): (0, I32_MAX)}     # checked
F32_MAX = float(np.finfo(np.float32).max)
# the NumPy dtype uopc's own dtypes come back as when the graph declares nothing
CANONICAL = {dtypes.f32: np.dtype(np.float32), dtypes.f16: np.dtype(np.float16), dtypes.i32: np.dtype(np.int64), dtypes.bool: np.dtype(np.bool_)}


def onnx_type_name(elem_type: int) -> str:
  try: return TensorProto.DataType.Name(elem_type)
  except ValueError: return f"element type {elem_type}"


def np_type(elem_type: int) -> np.dtype:
  """The NumPy dtype of an ONNX element type uopc computes; NotImplementedError for the others."""
  try: d = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
  except (KeyError, TypeError, ValueError): d = None
  if d is None or d not in COMPUTE or elem_type in (TensorProto.BFLOAT16,):
    raise NotImplementedError(f"uopc.onnx: values of type {onnx_type_name(elem_type)} are not supported (uopc computes bool, int8-64, "
                              "uint8-64, float16, float32 and float64)")
  return d


def compute_dtype(declared: np.dtype) -> DType:
  if declared not in COMPUTE: raise NotImplementedError(f"uopc.onnx: values of type {declared} are not supported")
  return COMPUTE[declared]


def check_host_fits(arr: np.ndarray, what: str) -> None:
  """Refuse host values the dtype they compute in can't hold: int64 and uint32/uint64 past i32, float64 past f32."""
  if arr.size == 0: return
  if arr.dtype in WIDE:
    lo, hi = WIDE[arr.dtype]
    if arr.min() < lo or arr.max() > hi:
      bad = arr.reshape(-1)[int(np.argmax((arr.reshape(-1) < lo) | (arr.reshape(-1) > hi)))]
      raise OnnxError(f"{what}: the {arr.dtype} value {bad} doesn't fit the i32 uopc computes {arr.dtype} in ({lo} to {hi})")
  elif arr.dtype == np.float64:
    finite = np.isfinite(arr)
    if finite.any() and np.abs(arr[finite]).max() > F32_MAX:
      raise OnnxError(f"{what}: the float64 value {np.abs(arr[finite]).max()} is past f32's range, which uopc computes float64 in")


def computed(arr: np.ndarray, declared: np.dtype | None, what: str) -> tuple[np.ndarray, DType]:
  """A host value converted to the NumPy dtype its declared type computes in (the array's own type when none is
  declared), checked to fit, and that uopc dtype."""
  arr = np.asarray(arr)
  declared = np.dtype(declared) if declared is not None else arr.dtype
  if arr.dtype.kind in "USO": raise NotImplementedError(f"uopc.onnx: {what} holds strings, which uopc doesn't compute")
  if arr.dtype != declared:
    if declared.kind in "iub" and arr.dtype.kind == "f":
      raise OnnxError(f"{what}: expected {declared} values, got {arr.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):
      conv = arr.astype(declared)
    if arr.dtype.kind in "iu" and declared.kind in "iu" and not np.array_equal(conv.astype(arr.dtype), arr):
      raise OnnxError(f"{what}: {arr.dtype} values don't fit the declared {declared}")
    arr = conv
  check_host_fits(arr, what)
  d = compute_dtype(declared)
  return (arr if arr.dtype == np_dtype(d) else arr.astype(np_dtype(d))), d


def to_tensor(arr: np.ndarray, declared: np.dtype | None, device: str, what: str, constant: bool = False) -> Tensor:
  """A host value as a Tensor of the dtype its declared type computes in (the array's own dtype when none is declared).
  A `constant` of one element (an initializer or a Constant node: the same on every call) becomes a constant of the
  graph rather than a buffer, so that arithmetic with it folds into the kernels that use it (GELU's x / sqrt(2) is a
  multiplication by 0.7071 in the kernel, not a kernel computing 1 / sqrt(2) from memory on every call)."""
  arr, d = computed(arr, declared, what)
  if constant and arr.size == 1: return Tensor.full(arr.shape, arr.reshape(-1)[0].item(), dtype=d, device=device)
  return Tensor(arr, device=device)


def to_numpy(t: Tensor, declared: np.dtype | None) -> np.ndarray:
  """A Tensor's value as a NumPy array of the declared type."""
  arr = t.numpy()
  return arr.astype(declared) if declared is not None and arr.dtype != declared else arr


def wrap(t: Tensor, declared: np.dtype) -> Tensor:
  """An i32 result of arithmetic on a narrow integer type, wrapped into that type's range (int8 127 + 1 is -128, as in
  ONNX's NumPy reference). (x - low) mod 2**bits + low: the floor modulo is never negative, and an i32 that wrapped
  on the way changed by a multiple of 2**32, which 2**bits divides."""
  lo, hi = NARROW[declared]
  return (t - lo) % (hi - lo + 1) + lo


def check(bad: Tensor, message: str) -> None:
  """Refuse the values where the bool tensor `bad` holds: the check runs on the realized values (and again on every
  uopc.jit replay, through the index checks' road)."""
  if bad.numel() == 0: return
  flag = bad.any().int().reshape(1)
  check_indices(flag, 0, 1, message.replace("{", "{{").replace("}", "}}"))


def check_fits(t: Tensor, declared: np.dtype, what: str) -> Tensor:
  """t (a float or i32 tensor holding the exact result of computing a value of `declared` type), refused where it doesn't
  fit the i32 that type computes in."""
  if declared in WIDE and t.dtype.is_float:
    lo, hi = WIDE[declared]
    check((t < lo) | (t > hi) | t.isnan(), f"{what}: a value doesn't fit the i32 uopc computes {declared} in ({lo} to {hi})")
  return t


def settle(t: Tensor, declared: np.dtype | None, exact: bool) -> Tensor:
  """A handler's result as the value of its declared type: cast to the dtype that type computes in, and wrapped into a
  narrow integer type's range unless the op only moves values (`exact`)."""
  if declared is None: return t
  d = compute_dtype(declared)
  if t.dtype is not d:
    if d is dtypes.i32 and t.dtype.is_float:
      check_fits(t, declared, f"a {declared} result")
      t = t.cast(d)
    else: t = t.cast(d)
  if declared in NARROW and not exact: t = wrap(t, declared)
  return t


def is_unsigned(declared: np.dtype | None) -> bool: return declared is not None and declared.kind == "u"


def dtype_range(declared: np.dtype) -> tuple[float, float]:
  """The values a declared type holds (floats: the finite range)."""
  if declared.kind in "iu": return int(np.iinfo(declared).min), int(np.iinfo(declared).max)
  if declared.kind == "b": return 0, 1
  return -float(np.finfo(declared).max), float(np.finfo(declared).max)
