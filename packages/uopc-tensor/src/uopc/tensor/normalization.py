"""uopc.tensor.normalization: softmax and its relatives, layernorm, and normalize (by a p-norm).

Each shifts or scales along an axis by a statistic of that axis: softmax by the (detached) max, so exp never
overflows; layernorm by the mean and variance (no affine parameters: nn.LayerNorm adds them); normalize by the p-norm,
clipped at eps. Computed in f32 for f16 inputs and rounded once (f16_in_f32).
"""
from __future__ import annotations
from uopc.tensor.core import TensorCore, f16_in_f32


class NormalizationMixin:
  """softmax, log_softmax, softmin, layernorm, normalize."""
  __slots__ = ()

  @f16_in_f32
  def softmax(self, axis: int = -1) -> TensorCore:
    if self.numel() == 0: return self.float()   # nothing to normalize (and no max of an empty axis to take)
    m = self.max(axis, keepdim=True)._stop_gradient()
    e = (self - m).exp()
    return e / e.sum(axis, keepdim=True)
  @f16_in_f32
  def log_softmax(self, axis: int = -1) -> TensorCore:
    if self.numel() == 0: return self.float()
    m = self.max(axis, keepdim=True)._stop_gradient()
    s = self - m
    return s - s.exp().sum(axis, keepdim=True).log()

  def softmin(self, axis: int = -1) -> TensorCore: return (-self).softmax(axis)

  @f16_in_f32
  def layernorm(self, axis=-1, eps: float = 1e-5) -> TensorCore:
    """(x - mean) / sqrt(var + eps) over `axis` (no affine parameters: nn.LayerNorm adds them)."""
    x = self.float()
    d = x - x.mean(axis, keepdim=True)
    return d * ((d * d).mean(axis, keepdim=True) + eps).rsqrt()

  @f16_in_f32
  def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> TensorCore:
    """self / max(||self||_p over dim, eps), as torch.nn.functional.normalize."""
    return self / self.norm(p, dim, keepdim=True).clip(min_=eps)
