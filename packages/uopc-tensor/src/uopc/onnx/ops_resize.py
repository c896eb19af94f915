"""uopc.onnx.ops_resize: Resize and Upsample.

Resizing is separable: each resized axis in turn is a weighted sum of a few input elements per output element. Which
elements and which weights depend on the shapes and attributes alone (sizes are known when the graph is built), so they
are computed on the host in float64 (`taps`: an (out, n) table of clamped source indices and one of coefficients, as
ONNX's reference computes them), and the device does the gathers and the weighted sum. Nearest is one tap of weight 1
(a pure gather: an infinity stays an infinity), linear two, cubic four, and with antialias as many as the scaled filter
covers. tf_crop_and_resize's points outside the region of interest take extrapolation_value.
"""
from __future__ import annotations
import math
import numpy as np
from uopc.tensor import Tensor
from uopc.onnx.registry import op
from uopc.onnx.dtypes import OnnxError

_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize")


def _source(mode: str, out: np.ndarray, scale: float, n_in: int, n_out: int, roi) -> tuple[np.ndarray, np.ndarray | None]:
  """The input coordinate of each output coordinate, and where tf_crop_and_resize extrapolates."""
  width = scale * n_in
  if mode == "align_corners": return (np.zeros_like(out) if width == 1 else out * (n_in - 1) / (width - 1)), None
  if mode == "asymmetric": return out / scale, None
  if mode == "tf_crop_and_resize":
    lo, hi = roi
    x = (np.full_like(out, (hi - lo) * (n_in - 1) / 2) if width == 1 else out * (hi - lo) * (n_in - 1) / (width - 1)) + lo * (n_in - 1)
    return x, (x < 0) | (x > n_in - 1)
  if mode == "pytorch_half_pixel": return (np.full_like(out, -0.5) if width == 1 else (out + 0.5) / scale - 0.5), None
  if mode == "half_pixel": return (out + 0.5) / scale - 0.5, None
  if mode == "half_pixel_symmetric":
    offset = n_in / 2 * (1 - n_out / width)
    return offset + (out + 0.5) / scale - 0.5, None
  raise OnnxError(f"Resize: coordinate_transformation_mode must be one of {', '.join(_MODES)}, got {mode!r}")


def _coeffs(mode: str, ratio: float, scale: float, nearest_mode: str, a: float, antialias: bool) -> np.ndarray:
  if mode == "nearest":
    if float(ratio).is_integer(): return np.array([0.0, 1.0])
    pick = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False, "ceil": True}
    if nearest_mode not in pick: raise OnnxError(f"Resize: unknown nearest_mode {nearest_mode!r}")
    return np.array([0.0, 1.0]) if pick[nearest_mode] else np.array([1.0, 0.0])
  if mode == "linear":
    if not antialias: return np.array([1 - ratio, ratio])
    s = min(scale, 1.0)
    start = int(np.floor(-1 / s) + 1)
    c = np.clip(1 - np.abs((np.arange(start, start + 2 - 2 * start) - ratio) * s), 0, 1)
    return c / c.sum()
  if mode == "cubic":
    if not antialias:
      r, q = ratio, 1 - ratio
      return np.array([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a, ((a + 2) * r - (a + 3)) * r * r + 1,
                       ((a + 2) * q - (a + 3)) * q * q + 1, ((a * (q + 1) - 5 * a) * (q + 1) + 8 * a) * (q + 1) - 4 * a])
    s = min(scale, 1.0)
    start = int(np.floor(-2 / s) + 1)
    x = np.abs(s * (np.arange(start, 2 - start) - ratio))
    c = np.where(x <= 1, (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1, np.where(x < 2, a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a, 0.0))
    return c / c.sum()
  raise OnnxError(f"Resize: mode must be nearest, linear or cubic, got {mode!r}")


def taps(n_in: int, n_out: int, scale: float, mode: str, coord_mode: str, nearest_mode: str, cubic_a: float, exclude_outside: bool,
         antialias: bool, roi) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
  """For one axis: (out, n) source indices (clamped into the input), (out, n) coefficients, and the outputs to extrapolate."""
  out = np.arange(n_out, dtype=np.float64)
  x, extrapolate = _source(coord_mode, out, scale, n_in, n_out, roi)
  base = np.floor(x).astype(np.int64)
  ratios = np.where(x == base, 1.0, x - base)
  coeffs = np.stack([_coeffs(mode, float(r), scale, nearest_mode, cubic_a, antialias) for r in ratios]) if n_out else np.zeros((0, 2))
  n = coeffs.shape[1]
  pad = int(np.ceil(n / 2))
  xp = x + pad
  p = np.floor(xp).astype(np.int64)
  frac = xp - p
  offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1) if n % 2 == 0 else np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
  idx = (p + offset)[:, None] + np.arange(n)[None, :] - pad
  if exclude_outside:
    coeffs = np.where((idx < 0) | (idx >= n_in), 0.0, coeffs)
    total = coeffs.sum(-1, keepdims=True)
    coeffs = coeffs / np.where(total == 0, 1.0, total)
  return np.clip(idx, 0, n_in - 1), coeffs, extrapolate


def resize_axis(x: Tensor, axis: int, n_out: int, scale: float, attrs: dict, roi) -> Tensor:
  idx, coeffs, extrapolate = taps(x.shape[axis], n_out, scale, attrs["mode"], attrs["coordinate_transformation_mode"], attrs["nearest_mode"],
                                  attrs["cubic_coeff_a"], bool(attrs["exclude_outside"]), bool(attrs["antialias"]), roi)
  t = x.transpose(axis, -1)
  if attrs["mode"] == "nearest":   # one tap of weight 1: a gather
    pick = np.where(coeffs.argmax(-1) == 0, idx[:, 0], idx[:, -1]) if idx.shape[1] > 1 else idx[:, 0]
    out = t[..., Tensor(pick.astype(np.int32), device=x.device)]
  else:
    tf = t if t.dtype.is_float else t.float()
    out = None
    for k in range(idx.shape[1]):
      if not np.any(coeffs[:, k]): continue
      term = tf[..., Tensor(idx[:, k].astype(np.int32), device=x.device)] * Tensor(coeffs[:, k].astype(np.float32), device=x.device)
      out = term if out is None else out + term
    if out is None: out = tf[..., Tensor(idx[:, 0].astype(np.int32), device=x.device)] * 0.0
  if extrapolate is not None and extrapolate.any():
    out = Tensor(extrapolate, device=x.device).where(float(attrs["extrapolation_value"]), out)
  return out.transpose(axis, -1)


def resize(ctx, x: Tensor, roi, scales, sizes, attrs: dict) -> Tensor:
  r = x.ndim
  axes = list(range(r)) if attrs.get("axes") is None else [a % r for a in attrs["axes"]]
  if roi is not None and np.asarray(roi).size: roi_full = _full(np.asarray(roi, np.float64).reshape(-1), axes, r)
  else: roi_full = None
  if sizes is not None and np.asarray(sizes).size:
    want = [int(v) for v in np.asarray(sizes).reshape(-1)]
    scale = [want[axes.index(a)] / x.shape[a] if a in axes else 1.0 for a in range(r)]
    out = [want[axes.index(a)] if a in axes else x.shape[a] for a in range(r)]
    policy = attrs.get("keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
      if policy not in ("not_larger", "not_smaller"): raise OnnxError(f"Resize: unknown keep_aspect_ratio_policy {policy!r}")
      s = (min if policy == "not_larger" else max)(scale[a] for a in axes)
      scale = [s if a in axes else 1.0 for a in range(r)]
      out = [int(s * x.shape[a] + 0.5) if a in axes else x.shape[a] for a in range(r)]
  elif scales is not None and np.asarray(scales).size:
    given = [float(v) for v in np.asarray(scales).reshape(-1)]
    scale = [given[axes.index(a)] if a in axes else 1.0 for a in range(r)]
    out = [int(math.floor(s * n)) for s, n in zip(scale, x.shape)]
  else: raise OnnxError("Resize: give scales or sizes")
  for a in axes:
    if math.isclose(scale[a], 1.0) and out[a] == x.shape[a] and (roi_full is None or (roi_full[a] == 0 and roi_full[a + r] == 1)): continue
    x = resize_axis(x, a, out[a], scale[a], attrs, None if roi_full is None else (roi_full[a], roi_full[a + r]))
  return x


def _full(roi: np.ndarray, axes: list[int], r: int) -> np.ndarray:
  if len(roi) == 2 * r and len(axes) == r: return roi
  full = np.array([0.0] * r + [1.0] * r)
  for i, a in enumerate(axes): full[a], full[a + r] = roi[i], roi[len(axes) + i]
  return full


_DEFAULTS = dict(antialias=0, axes=None, coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
                 extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest", nearest_mode="round_prefer_floor")


@op("Resize", since=11, const=(1, 2, 3), attrs=tuple(_DEFAULTS))
def resize_11(ctx, x, roi=None, scales=None, sizes=None, **attrs):
  return resize(ctx, x, roi, scales, sizes, {**_DEFAULTS, **attrs})


@op("Resize", since=10, const=(1,), attrs=("mode",))
def resize_10(ctx, x, scales, **attrs):
  return resize(ctx, x, None, scales, None, {**_DEFAULTS, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor", **attrs})


@op("Upsample", since=9, const=(1,), attrs=("mode",))
def upsample_9(ctx, x, scales, **attrs): return resize_10(ctx, x, scales, **attrs)


@op("Upsample", since=7, attrs=("mode", "scales"))
def upsample_7(ctx, x, **attrs):
  return resize_10(ctx, x, np.array(attrs.pop("scales"), np.float32), **attrs)
