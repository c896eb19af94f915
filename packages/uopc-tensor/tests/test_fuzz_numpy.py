"""Differential fuzzer: random Tensor programs against NumPy, on every backend present.

A program starts from one to three input arrays (shapes with 0 and 1 axes, scalars; f32 values among -0.0, inf and NaN,
i32 and bool) and applies up to six random steps, each done twice: with Tensor methods and with their NumPy meaning
(float32 arithmetic). The steps cover every elementwise op (unary, binary with broadcasting, comparisons, where, clip,
casts, integer floor division and modulo), reductions over any axes with keepdim, argmax/argmin, reshape, permute,
expand, slicing with steps (negative too), flip, pad, cat, stack, squeeze/unsqueeze, gathers with integer tensors and
matmul (batched and 1-D). Exact steps must match bit for bit (NaN matching NaN); a program with a rounding step (a
transcendental, a division, a mean, a long sum) matches to a few ulps of its magnitude.

A failure prints a reproducer: the program as Python, with its inputs. UOPC_FUZZ_ITERS=N draws N programs per backend
(CI: 60 on C; backends other than C get a quarter).
"""
import math, os
import numpy as np
import pytest
from hypothesis import given, settings, note, HealthCheck, strategies as st
from uopc.backends import get_backend, BackendError
from uopc.tensor import Tensor

ITERS = int(os.environ.get("UOPC_FUZZ_ITERS", "60"))
F32 = [0.0, -0.0, 1.0, -1.5, 2.5, 0.25, 3.0, -7.0, 0.1, math.nan, math.inf, -math.inf]
I32 = [0, 1, -1, 2, -3, 5, 7, -8, 100]


class Value:
  """One value of the program in both worlds, and the Python that made it."""
  def __init__(self, t: Tensor, a: np.ndarray, name: str):
    self.t, self.a, self.name = t, a, name


class Program:
  def __init__(self, draw, device: str):
    self.draw, self.device = draw, device
    self.lines: list[str] = []
    self.values: list[Value] = []
    self.approximate = False     # a step that rounds differently from NumPy by design (a few ulps)

  def new(self, t: Tensor, a: np.ndarray, code: str) -> Value:
    name = f"v{len(self.values)}"
    self.lines.append(f"{name} = {code}")
    v = Value(t, a, name)
    self.values.append(v)
    return v

  def input(self) -> Value:
    d = self.draw
    shape = tuple(d(st.lists(st.sampled_from([0, 1, 1, 2, 3, 4, 5]), max_size=3)))
    kind = d(st.sampled_from(["f32", "f32", "f32", "i32", "bool"]))
    n = math.prod(shape)
    if kind == "f32": a = np.array(d(st.lists(st.sampled_from(F32), min_size=n, max_size=n)), np.float32).reshape(shape)
    elif kind == "i32": a = np.array(d(st.lists(st.sampled_from(I32), min_size=n, max_size=n)), np.int32).reshape(shape)
    else: a = np.array(d(st.lists(st.booleans(), min_size=n, max_size=n)), np.bool_).reshape(shape)
    return self.new(Tensor(a, device=self.device), a, f"Tensor(np.array({a.tolist()!r}, np.{a.dtype.name}).reshape({shape}), device={self.device!r})")


def _axes(draw, ndim: int):
  if ndim == 0 or draw(st.booleans()): return None
  return tuple(sorted(draw(st.sets(st.integers(0, ndim - 1), min_size=1, max_size=ndim))))


def _has_value(shape, axes) -> bool:
  """max/argmax over these axes has a value: none of them is empty (NumPy raises otherwise, and so does uopc)."""
  return math.prod(shape[i] for i in (range(len(shape)) if axes is None else axes)) > 0


UNARY = {  # name: (Tensor method, NumPy function, rounds differently by design)
  "neg": (lambda t: -t, np.negative, False), "abs": (lambda t: t.abs(), np.abs, False),
  "relu": (lambda t: t.relu(), lambda a: np.maximum(a, 0), False),
  "floor": (lambda t: t.floor(), np.floor, False), "ceil": (lambda t: t.ceil(), np.ceil, False), "trunc": (lambda t: t.trunc(), np.trunc, False),
  "round": (lambda t: t.round(), np.round, False), "square": (lambda t: t.square(), np.square, False), "sign": (lambda t: t.sign(), np.sign, False),
  "exp": (lambda t: t.exp(), np.exp, True), "log": (lambda t: t.log(), np.log, True), "sqrt": (lambda t: t.sqrt(), np.sqrt, False),
  "sin": (lambda t: t.sin(), np.sin, True), "cos": (lambda t: t.cos(), np.cos, True), "tanh": (lambda t: t.tanh(), np.tanh, True),
  "sigmoid": (lambda t: t.sigmoid(), lambda a: 1 / (1 + np.exp(-a)), True), "recip": (lambda t: t.recip(), np.reciprocal, True),
  "exp2": (lambda t: t.exp2(), np.exp2, True), "log2": (lambda t: t.log2(), np.log2, True),
  "rsqrt": (lambda t: t.rsqrt(), lambda a: 1 / np.sqrt(a), True), "silu": (lambda t: t.silu(), lambda a: a / (1 + np.exp(-a)), True),
  "leaky_relu": (lambda t: t.leaky_relu(), lambda a: np.where(a > 0, a, a * np.float32(0.01)), False),
  "logical_not": (lambda t: t.logical_not().float(), lambda a: np.logical_not(a).astype(np.float32), False),
}
BINARY = {
  "add": (lambda x, y: x + y, np.add, False), "sub": (lambda x, y: x - y, np.subtract, False), "mul": (lambda x, y: x * y, np.multiply, False),
  "div": (lambda x, y: x / y, np.true_divide, True), "maximum": (lambda x, y: x.maximum(y), np.maximum, False),
  "minimum": (lambda x, y: x.minimum(y), np.minimum, False), "lt": (lambda x, y: x < y, np.less, False),
  "le": (lambda x, y: x <= y, np.less_equal, False),
  "gt": (lambda x, y: x > y, np.greater, False), "ge": (lambda x, y: x >= y, np.greater_equal, False), "eq": (lambda x, y: x == y, np.equal, False),
  "ne": (lambda x, y: x != y, np.not_equal, False), "pow": (lambda x, y: x.pow(y), np.power, True),
  "floordiv": (lambda x, y: x // y, np.floor_divide, False), "mod": (lambda x, y: x % y, np.remainder, False),
}


def step(p: Program, draw) -> None:
  """One random step on the values so far (a step that doesn't apply to the value it picked does nothing)."""
  v = draw(st.sampled_from(p.values))
  t, a, shape = v.t, v.a, v.a.shape
  f = a.dtype == np.float32
  kind = draw(st.sampled_from(["unary", "binary", "binary", "scalar", "where", "clip", "cast", "intdiv", "reduce", "argmax", "reshape",
                               "permute", "expand", "slice", "flip", "pad", "cat", "stack", "squeeze", "gather", "matmul"]))
  with np.errstate(all="ignore"):
    if kind == "unary" and f:
      name = draw(st.sampled_from(sorted(UNARY)))
      fn, ref, approx = UNARY[name]
      p.approximate |= approx
      p.new(fn(t), ref(a).astype(np.float32), f"{v.name}.{name}()")
    elif kind == "binary":
      w = draw(st.sampled_from(p.values))
      try: out_shape = np.broadcast_shapes(a.shape, w.a.shape)
      except ValueError: return
      name = draw(st.sampled_from(sorted(BINARY)))
      fn, ref, approx = BINARY[name]
      if name in ("div", "pow", "floordiv", "mod") and (a.dtype != np.float32 or w.a.dtype != np.float32): return   # NumPy's int rules differ
      if a.dtype == np.bool_ and w.a.dtype == np.bool_ and name in ("sub", "div"): return     # NumPy refuses bool subtraction
      if a.dtype != w.a.dtype: return                                                           # promotion rules differ for mixed dtypes
      p.approximate |= approx
      p.new(fn(t, w.t), np.asarray(ref(a, w.a)).reshape(out_shape), f"{BINARY_CODE[name].format(v.name, w.name)}")
    elif kind == "scalar" and a.dtype != np.bool_:
      c = draw(st.sampled_from([2, -3, 0.5, 1.5, -0.0] if f else [2, -3, 7]))
      op = draw(st.sampled_from(["add", "mul", "sub", "pow"]))
      if op == "pow":
        e = draw(st.sampled_from([2, 3, -1, 0]))
        if not f and e < 0: return
        p.approximate |= e < 0 or e == 3
        p.new(t ** e, np.power(a, np.array(e, a.dtype)).astype(a.dtype), f"{v.name} ** {e}")
      else:
        sc = np.array(c, a.dtype)
        p.new({"add": t + c, "mul": t * c, "sub": t - c}[op], {"add": a + sc, "mul": a * sc, "sub": a - sc}[op].astype(a.dtype),
              f"{v.name} {'+*-'['add mul sub'.split().index(op)]} {c!r}")
    elif kind == "where":
      w = draw(st.sampled_from(p.values))
      if w.a.dtype != a.dtype: return
      try: out_shape = np.broadcast_shapes(a.shape, w.a.shape)
      except ValueError: return
      cond = (a > 0) if a.dtype != np.bool_ else a
      ct = (t > 0) if a.dtype != np.bool_ else t
      p.new(ct.where(t, w.t), np.where(cond, a, w.a).reshape(out_shape), f"({v.name} > 0).where({v.name}, {w.name})")
    elif kind == "clip" and f:
      lo, hi = draw(st.sampled_from([(-1.0, 1.0), (0.0, 2.5), (-math.inf, 0.0)]))
      p.new(t.clip(lo, hi), np.clip(a, np.float32(lo), np.float32(hi)), f"{v.name}.clip({lo!r}, {hi!r})")
    elif kind == "cast":
      to = draw(st.sampled_from(["float", "int", "bool"]))
      if to == "int" and f and not np.isfinite(a).all(): return        # NaN and inf have no i32 (uopc says INT_MIN, C nothing)
      p.new(getattr(t, to)(), a.astype({"float": np.float32, "int": np.int32, "bool": np.bool_}[to]), f"{v.name}.{to}()")
    elif kind == "intdiv" and a.dtype == np.int32:
      c = draw(st.sampled_from([2, -3, 7, 1]))
      if draw(st.booleans()): p.new(t // c, a // np.int32(c), f"{v.name} // {c}")
      else: p.new(t % c, a % np.int32(c), f"{v.name} % {c}")
    elif kind == "reduce":
      axes, keep = _axes(draw, a.ndim), draw(st.booleans())
      op = draw(st.sampled_from(["sum", "max", "min", "mean", "any", "all"] + (["var"] if f else [])))
      if op in ("max", "min") and not _has_value(shape, axes): return
      if op in ("mean", "var") and not f: return
      p.approximate |= op in ("sum", "mean", "var")
      ref = getattr(np, op)(a, axis=axes, keepdims=keep) if op != "var" else np.var(a.astype(np.float64), axis=axes, keepdims=keep, ddof=1)
      if op == "sum" and a.dtype == np.bool_: ref = ref.astype(np.int32)
      ref = np.asarray(ref).astype(np.float32 if op in ("mean", "var") else ref.dtype if op != "sum" else (np.float32 if f else np.int32))
      p.new(getattr(t, op)(axes, keepdim=keep) if op != "var" else t.var(axes, keepdim=keep), ref, f"{v.name}.{op}({axes}, keepdim={keep})")
    elif kind == "argmax" and a.dtype != np.bool_ and a.ndim:
      axis = draw(st.integers(-a.ndim, a.ndim - 1))
      if not _has_value(shape, (axis % a.ndim,)): return
      op = draw(st.sampled_from(["argmax", "argmin"]))
      p.new(getattr(t, op)(axis), getattr(np, op)(a, axis=axis).astype(np.int32), f"{v.name}.{op}({axis})")
    elif kind == "reshape":
      n = a.size
      divs = [k for k in range(1, n + 1) if n % k == 0] or [1]
      k = draw(st.sampled_from(divs)) if n else draw(st.sampled_from([0, 1]))
      new = (k, n // k) if n else (k, 0) if k else (0, draw(st.integers(0, 3)))
      if draw(st.booleans()) and n: new = (-1,) + new[1:]
      p.new(t.reshape(new), a.reshape(new), f"{v.name}.reshape({new})")
    elif kind == "permute" and a.ndim:
      perm = tuple(draw(st.permutations(range(a.ndim))))
      p.new(t.permute(perm), a.transpose(perm), f"{v.name}.permute({perm})")
    elif kind == "expand":
      new = tuple(draw(st.sampled_from([2, 3])) if s == 1 else s for s in shape)
      if draw(st.booleans()): new = (2,) + new
      p.new(t.expand(new), np.broadcast_to(a, new), f"{v.name}.expand({new})")
    elif kind == "slice" and a.ndim:
      bound = lambda *xs: draw(st.sampled_from([None, *xs]))
      idx = tuple(slice(bound(0, 1, -1, -2), bound(3, -1, 0), bound(1, 2, -1, -2, 3)) for _ in range(draw(st.integers(1, a.ndim))))
      p.new(t[idx], a[idx], f"{v.name}[{', '.join(f'{s.start}:{s.stop}:{s.step}' for s in idx)}]".replace("None", ""))
    elif kind == "flip" and a.ndim:
      axis = draw(st.integers(0, a.ndim - 1))
      p.new(t.flip(axis), np.flip(a, axis), f"{v.name}.flip({axis})")
    elif kind == "pad" and a.ndim and a.dtype != np.bool_:
      widths = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(a.ndim))
      value = draw(st.sampled_from([0.0, 1.5] if f else [0, 3]))
      p.new(t.pad(widths, value=value), np.pad(a, widths, constant_values=value), f"{v.name}.pad({widths}, value={value!r})")
    elif kind in ("cat", "stack"):
      same = [w for w in p.values if w.a.dtype == a.dtype and w.a.shape == shape]
      w = draw(st.sampled_from(same))
      if kind == "stack":
        dim = draw(st.integers(0, a.ndim))
        p.new(Tensor.stack(t, w.t, dim=dim), np.stack([a, w.a], dim), f"Tensor.stack({v.name}, {w.name}, dim={dim})")
      elif a.ndim:
        dim = draw(st.integers(0, a.ndim - 1))
        p.new(Tensor.cat(t, w.t, dim=dim), np.concatenate([a, w.a], dim), f"Tensor.cat({v.name}, {w.name}, dim={dim})")
    elif kind == "squeeze":
      if draw(st.booleans()) or not a.ndim:
        dim = draw(st.integers(0, a.ndim))
        p.new(t.unsqueeze(dim), np.expand_dims(a, dim), f"{v.name}.unsqueeze({dim})")
      else: p.new(t.squeeze(), np.squeeze(a), f"{v.name}.squeeze()")
    elif kind == "gather" and a.ndim and shape[0]:
      n = shape[0]
      ids = np.array(draw(st.lists(st.integers(-n, n - 1), min_size=0, max_size=4)), np.int32)
      p.new(t[Tensor(ids, device=p.device)], a[ids], f"{v.name}[Tensor(np.array({ids.tolist()}, np.int32), device={p.device!r})]")
    elif kind == "matmul" and a.ndim and a.dtype != np.bool_:
      k = shape[-1]
      m = draw(st.sampled_from([1, 2, 3]))
      bshape = (k,) if draw(st.booleans()) else (k, m)
      n = math.prod(bshape)
      b = np.array(draw(st.lists(st.sampled_from(F32[:8] if f else I32), min_size=n, max_size=n)), a.dtype).reshape(bshape)
      bt = Tensor(b, device=p.device)
      p.approximate |= f
      p.new(t @ bt, np.matmul(a, b), f"{v.name} @ Tensor(np.array({b.tolist()!r}, np.{a.dtype.name}), device={p.device!r})")


BINARY_CODE = {"add": "{} + {}", "sub": "{} - {}", "mul": "{} * {}", "div": "{} / {}", "maximum": "{}.maximum({})", "minimum": "{}.minimum({})",
               "lt": "{} < {}", "le": "{} <= {}", "gt": "{} > {}", "ge": "{} >= {}", "eq": "{} == {}", "ne": "{} != {}",
               "pow": "{}.pow({})", "floordiv": "{} // {}", "mod": "{} % {}"}


def compare(p: Program) -> None:
  out = p.values[-1]
  got, ref = out.t.numpy(), np.asarray(out.a)
  header = ["import numpy as np", "from numpy import nan, inf", "from uopc.tensor import Tensor"]
  program = "\n".join(header + p.lines + [f"print({out.name}.numpy())"])
  msg = f"\n--- reproducer ({'rounding' if p.approximate else 'exact'} comparison) ---\n{program}\n--- NumPy says\n{ref!r}\n--- uopc says\n{got!r}"
  assert got.shape == ref.shape, msg
  assert got.dtype.kind == ref.dtype.kind or (got.dtype.kind in "iu" and ref.dtype.kind in "iu"), msg
  if ref.dtype.kind != "f" or not p.approximate: np.testing.assert_array_equal(got, ref.astype(got.dtype), err_msg=msg)
  else:
    finite = np.abs(ref[np.isfinite(ref)]).astype(np.float64)
    scale = 1.0 + (finite.max() if finite.size else 0.0)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=2e-5 * scale, equal_nan=True, err_msg=msg)


def device_or_skip(name: str) -> str:
  """`name` if kernels can run on it here; CUDA renders and compiles without a GPU, so a tiny tensor is made to find out."""
  try: get_backend(name) and Tensor([1.0], device=name).numpy()
  except BackendError as e: pytest.skip(f"backend {name} is not available here: {e}")
  return name


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # NumPy warns about its own NaNs and empty means; they are the oracle
@pytest.mark.parametrize("device", ["C", "PYTHON", "CUDA"])
def test_random_tensor_programs_match_numpy(device):
  device_or_skip(device)

  @settings(max_examples=ITERS if device == "C" else max(1, ITERS // 4), deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
  @given(st.data())
  def run(data):
    p = Program(data.draw, device)
    for _ in range(data.draw(st.integers(1, 3))): p.input()
    for _ in range(data.draw(st.integers(1, 6))): step(p, data.draw)
    note("\n".join(p.lines))
    compare(p)

  run()
