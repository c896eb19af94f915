"""Data types and address spaces: the two small records every UOp carries besides its shape.

A DType is a frozen record (name, itemsize, C type, struct/NumPy format character, lanes). There are five
scalars: void (things that are not values, like a store), bool, i32, f32 and f16. DTypes are interned: building
DType("f32", 4, "float", "f") again, unpickling one or deep-copying one gives back `dtypes.f32` itself,
so `is` and `==` agree and the hot paths of the compiler may compare dtypes by identity.

A vector dtype is `d.vec(n)`: n lanes of scalar d (`dtypes.f32.vec(8)` is f32x8), interned like the scalars, with
`.count` lanes and `.scalar()` its lane's dtype (a scalar's count is 1 and its scalar() is itself). Vectors are made
only by lowering's last pass (uopc.vectorize) for SIMD lanes and wide memory moves; memory holds scalars, so a vector
has no NumPy format.

AddrSpace says where a UOp lives: ALU is a plain value in a register, the rest are memory.
"""
from __future__ import annotations
import math
from dataclasses import dataclass
from enum import Enum, auto

_interned: dict[tuple, DType] = {}


@dataclass(frozen=True, eq=True)
class DType:
  name: str
  itemsize: int
  ctype: str
  fmt: str | None  # struct / numpy format character
  count: int = 1   # lanes: 1 for a scalar, n for d.vec(n)

  def __new__(cls, name: str, itemsize: int, ctype: str, fmt: str | None, count: int = 1):
    # interning: a DType with the same fields is the same object (dataclass __init__ then re-sets equal fields)
    if (d := _interned.get((name, itemsize, ctype, fmt, count))) is not None: return d
    d = super().__new__(cls)
    _interned[(name, itemsize, ctype, fmt, count)] = d
    return d

  def __reduce__(self):
    return (DType, (self.name, self.itemsize, self.ctype, self.fmt)) if self.count == 1 else (_vec, (self.scalar(), self.count))
  def __repr__(self): return "dtypes." + self.name if self.count == 1 else f"dtypes.{self.scalar().name}.vec({self.count})"
  __hash__ = object.__hash__   # interned, so identity hashing agrees with the dataclass equality (and is faster)

  def vec(self, n: int) -> DType:
    """n lanes of this scalar dtype (f32x8); vec(1) is the scalar itself."""
    if (v := _vectors.get((self, n))) is not None: return v
    if self.count != 1 or self.itemsize == 0: raise ValueError(f"vec: {self!r} has no vectors (only a scalar value dtype does)")
    if type(n) is not int or n < 1: raise ValueError(f"vec: a vector has a positive int of lanes, got {n!r}")
    if n == 1: return self
    v = _vectors[(self, n)] = DType(f"{self.name}x{n}", self.itemsize * n, self.ctype, None, n)
    _scalars[v] = self
    return v

  def scalar(self) -> DType:
    """The dtype of one lane: itself for a scalar."""
    return self if self.count == 1 else _scalars[self]

  @property
  def is_float(self) -> bool: return self.name[0] == "f"     # f32, f16
  @property
  def is_int(self) -> bool: return self.name[0] == "i"       # i32


_vectors: dict[tuple[DType, int], DType] = {}
_scalars: dict[DType, DType] = {}
def _vec(scalar: DType, n: int) -> DType: return scalar.vec(n)   # how a vector dtype unpickles: through vec, so it is interned


class dtypes:
  void = DType("void", 0, "void", None)
  bool = DType("bool", 1, "_Bool", "?")
  i32 = DType("i32", 4, "int", "i")
  f32 = DType("f32", 4, "float", "f")
  f16 = DType("f16", 2, "_Float16", "e")
  all = (void, bool, i32, f32, f16)

  @staticmethod
  def from_name(name: str) -> DType:
    for d in dtypes.all:
      if d.name == name: return d
    raise ValueError(f"unknown dtype {name!r} (expected one of {', '.join(d.name for d in dtypes.all)})")

  @staticmethod
  def from_py(x) -> DType:
    # bool before int: in python True is an int
    if isinstance(x, bool): return dtypes.bool
    if isinstance(x, int): return dtypes.i32
    if isinstance(x, float): return dtypes.f32
    raise TypeError(f"no dtype for python value {x!r}")

  # the smallest and largest value of each dtype (floats reach the infinities)
  @staticmethod
  def min(d: DType): return _LIMITS[d.name][0] if d.name in _LIMITS else -math.inf

  @staticmethod
  def max(d: DType): return _LIMITS[d.name][1] if d.name in _LIMITS else math.inf


I32_MIN, I32_MAX = -2**31, 2**31 - 1   # the one spelling of the i32 range; everything else imports these
_LIMITS = {"bool": (False, True), "i32": (I32_MIN, I32_MAX)}


class AddrSpace(Enum):
  """Where a UOp lives: ALU is a value (a register, for a C compiler); GLOBAL, LOCAL and SHARED are kinds of memory."""
  ALU = auto()      # a value
  GLOBAL = auto()   # device memory, a function argument
  LOCAL = auto()    # call-scope storage: `float acc[4];`
  SHARED = auto()   # GPU workgroup shared memory

  def __repr__(self): return "AddrSpace." + self.name
  __hash__ = object.__hash__
