"""uopc.tensor.losses: the loss functions of torch.nn.functional, with its reductions ("mean", "sum", "none").

Regression losses (mse, l1, smooth_l1, huber), kl_div, binary cross-entropy (of probabilities, with torch's clamped
logs and gradients; and of logits, through a softplus that never overflows), and the class losses: nll_loss and
cross_entropy of scores (N, C, d...) or (C,) against class indices, whose values are checked as torch checks them (an
index past the classes would pick nothing and give a finite loss), or against class probabilities.
"""
from __future__ import annotations
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops
from uopc.tensor.errors import TensorError, TensorTypeError
from uopc.tensor.capture import check_indices
from uopc.tensor.core import TensorCore, f16_in_f32, broadcast_uop
from uopc.tensor.creation import positions, const_uop
from uopc.tensor.normalization import log_softmax_last_uop


class LossMixin:
  """Losses of predictions (self) against targets."""
  __slots__ = ()

  def _apply_reduction(self, reduction: str, what: str) -> TensorCore:
    """Per-element losses reduced as torch's `reduction=` asks: "none" keeps them, "sum" adds them, "mean" averages."""
    if reduction == "none": return self
    if reduction == "sum": return self.sum()
    if reduction == "mean": return self.mean()
    raise TensorTypeError(f"{what}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
  @f16_in_f32
  def mse_loss(self, target: TensorCore, reduction: str = "mean") -> TensorCore: return ((self - target) ** 2)._apply_reduction(reduction, "mse_loss")
  @f16_in_f32
  def l1_loss(self, target: TensorCore, reduction: str = "mean") -> TensorCore: return (self - target).abs()._apply_reduction(reduction, "l1_loss")
  @f16_in_f32
  def smooth_l1_loss(self, target: TensorCore, reduction: str = "mean", beta: float = 1.0) -> TensorCore:
    """0.5 d^2 / beta where |d| < beta, |d| - beta / 2 beyond (the L1 loss for beta 0)."""
    d = (self - target).abs()
    loss = d if beta == 0 else (d < beta).where(0.5 * d * d / beta, d - 0.5 * beta)
    return loss._apply_reduction(reduction, "smooth_l1_loss")
  @f16_in_f32
  def huber_loss(self, target: TensorCore, reduction: str = "mean", delta: float = 1.0) -> TensorCore:
    d = (self - target).abs()
    return (d < delta).where(0.5 * d * d, delta * (d - 0.5 * delta))._apply_reduction(reduction, "huber_loss")
  @f16_in_f32
  def kl_div(self, target: TensorCore, reduction: str = "mean", log_target: bool = False) -> TensorCore:
    """target * (log target - self) with self the log-probabilities (0 where target is 0); "batchmean" divides the sum by
    the batch size, as the KL divergence's definition wants."""
    if log_target: loss = target.exp() * (target - self)
    else: loss = target.eq(0).where(0.0, target * target.eq(0).where(1.0, target).log()) - target * self
    if reduction == "batchmean": return loss.sum() / (self.shape[0] if self.ndim else 1)
    return loss._apply_reduction(reduction, "kl_div")
  @f16_in_f32
  def binary_cross_entropy(self, target: TensorCore, weight: TensorCore | None = None, reduction: str = "mean") -> TensorCore:
    """-(t log p + (1 - t) log(1 - p)) of probabilities p = self, each log clamped at -100, with torch's gradients:
    (p - t) / max(p (1 - p), 1e-12) for p (finite at p = 0 and 1, where the clamp would give 0) and log(1 - p) - log p for t."""
    target = target if isinstance(target, TensorCore) else type(self).full((), float(target), device=self.device)
    p, t = self._stop_gradient(), target._stop_gradient()
    loss = -(t * p.log().clip(min_=-100) + (1 - t) * (-p).log1p().clip(min_=-100))
    loss = loss._with_gradient((self, (p - t) / (p * (1 - p)).clip(min_=1e-12)), (target, (-p).log1p() - p.log()))
    return (loss * weight if weight is not None else loss)._apply_reduction(reduction, "binary_cross_entropy")
  @f16_in_f32
  def binary_cross_entropy_with_logits(self, target: TensorCore, weight: TensorCore | None = None, reduction: str = "mean",
                                       pos_weight: TensorCore | None = None) -> TensorCore:
    """binary_cross_entropy(sigmoid(self), target) without forming the sigmoid: (1 - t) x + (1 + (pw - 1) t) softplus(-x),
    with softplus(-x) = log(1 + e^-|x|) + max(-x, 0), which never overflows."""
    lw = 1 + (pos_weight - 1) * target if pos_weight is not None else 1
    loss = (1 - target) * self + lw * ((-self.abs()).exp().log1p() + (-self).clip(min_=0))
    return (loss * weight if weight is not None else loss)._apply_reduction(reduction, "binary_cross_entropy_with_logits")
  binary_crossentropy, binary_crossentropy_logits = binary_cross_entropy, binary_cross_entropy_with_logits   # tinygrad's names
  def _class_last(self) -> TensorCore:
    """Scores (N, C, d...) as (N * d..., C), and (C,) as (1, C): the class axis last, one row per prediction."""
    if self.ndim == 1: return self.reshape(1, -1)
    return (self if self.ndim == 2 else self.permute([0] + list(range(2, self.ndim)) + [1])).reshape(-1, self.shape[1])
  def _class_targets(self, target, what: str, ignore_index: int) -> TensorCore:
    """Class indices for scores (N, C, d...) or (C,): i32 of shape (N, d...) or (), each in [0, C) or ignore_index (checked
    on the values, as torch does: an index past the classes would pick nothing and give a finite loss)."""
    target = target if isinstance(target, TensorCore) else type(self)(target, device=self.device)
    if target.dtype is not dtypes.i32: raise TensorError(f"{what}: target must hold class indices (i32), got {target.dtype.name}")
    want = self.shape[:1] + self.shape[2:] if self.ndim > 1 else ()
    if target.shape != want: raise TensorError(f"{what}: scores {self.shape} need class indices of shape {want}, got {target.shape}")
    C = self.shape[1 if self.ndim > 1 else 0]
    check_indices(target, 0, C, f"{what}: target {{}} is out of range for {C} classes", ignore_index)
    return target
  @f16_in_f32
  def nll_loss(self, target: TensorCore, weight: TensorCore | None = None, ignore_index: int = -100, reduction: str = "mean") -> TensorCore:
    """-self[target] (times weight[target]) for log-probabilities (N, C, d...) or (C,) and class indices (N, d...) or ();
    "mean" divides by the summed weights of the targets not ignored, as torch does."""
    return self._nll(self._class_targets(target, "nll_loss", ignore_index), weight, ignore_index, reduction)
  def _nll(self, target: TensorCore, weight: TensorCore | None, ignore_index: int, reduction: str) -> TensorCore:
    logp, t = self._class_last(), target.reshape(-1)
    keep = t.ne(ignore_index)
    at = keep.where(t, 0)                       # an ignored target reads class 0, and counts for nothing
    w = keep.float()
    if weight is not None: w = weight._gather([(0, at)], checked=True) * w
    # each row's target log-probability, loaded (a GATHER along the classes, the rows its batch axis: a one-hot summed
    # over the classes was a scan of every log-probability, 12 ms of a step at 8192 classes, in one thread)
    picked = logp._new(logp.uop.gather(at.reshape(-1, 1).uop, 1), logp).reshape(-1)
    loss = -keep.where(picked, 0.0) * w
    if reduction == "none": return loss.reshape(target.shape)
    if reduction == "sum": return loss.sum()
    if reduction != "mean": raise TensorTypeError(f"nll_loss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return loss.sum() / w.sum()
  @f16_in_f32
  def cross_entropy(self, target: TensorCore, weight: TensorCore | None = None, ignore_index: int = -100, reduction: str = "mean",
                    label_smoothing: float = 0.0) -> TensorCore:
    """torch.nn.functional.cross_entropy of logits (N, C, d...) or (C,) with class indices (N, d...) or (), or with class
    probabilities of the logits' shape. label_smoothing mixes the targets with the uniform distribution."""
    if not 0 <= label_smoothing <= 1: raise TensorError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    target = target if isinstance(target, TensorCore) else type(self)(target, device=self.device)
    if weight is None and not label_smoothing and reduction == "mean" and (fast := self._cross_entropy_uops(target, ignore_index)) is not None:
      return fast
    cdim = 0 if self.ndim == 1 else 1
    C = self.shape[cdim]
    logp = self.log_softmax(cdim)
    wshape = tuple(C if k == cdim else 1 for k in range(self.ndim))
    if target.dtype.is_float:   # class probabilities
      if target.shape != self.shape: raise TensorError(f"cross_entropy: probabilities {target.shape} for logits {self.shape}")
      p = target * (1 - label_smoothing) + label_smoothing / C if label_smoothing else target
      loss = -(logp * p * (weight.reshape(wshape) if weight is not None else 1)).sum(cdim)
      return loss._apply_reduction(reduction, "cross_entropy")
    target = self._class_targets(target, "cross_entropy", ignore_index)
    if not label_smoothing: return logp._nll(target, weight, ignore_index, reduction)   # (built once: half of a step's loss graph)
    nll = logp._nll(target, weight, ignore_index, "none")
    keep = target.ne(ignore_index).float()
    smooth = -(logp * (weight.reshape(wshape) if weight is not None else 1)).sum(cdim) * keep
    loss = (1 - label_smoothing) * nll + (label_smoothing / C) * smooth
    if reduction == "none": return loss
    if reduction == "sum": return loss.sum()
    if reduction != "mean": raise TensorTypeError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    t = target.reshape(-1)
    w = t.unsqueeze(-1).eq(positions(self, C)).where(weight, 0.0).sum(-1) if weight is not None else 1.0
    return loss.sum() / (w * t.ne(ignore_index).float()).sum()
  def _cross_entropy_uops(self, target: TensorCore, ignore_index: int) -> TensorCore | None:
    """cross_entropy's common case, f32 logits (N, C) and class indices (N,) on their device, no weights or smoothing,
    the mean: its targets checked as the general road checks them, then straight to UOps, the graph of log_softmax and
    _nll's Tensor ops node for node (a test holds them to it), for a third of their Python. None otherwise."""
    x = self.uop
    if x.dtype is not dtypes.f32 or len(x.shape) != 2 or 0 in x.shape or target.dtype is not dtypes.i32 or \
       target.shape != x.shape[:1] or target.device != self.device or type(ignore_index) is not int: return None
    t = self._class_targets(target, "cross_entropy", ignore_index).uop
    n, c = x.shape
    ADD, MUL = Ops.ADD, Ops.MUL
    logp = log_softmax_last_uop(x)
    # _nll: the targets' log-probabilities loaded (an ignored one reads class 0 and counts for nothing), the kept ones'
    # weight, the mean
    keep = UOp(Ops.CMPNE, (t, t.const_like(ignore_index)))
    at = UOp(Ops.WHERE, (keep, t, broadcast_uop(const_uop(0, dtypes.i32), (n,))))
    w = UOp(Ops.CAST, (keep,), dtypes.f32)
    picked = logp.gather(at.reshape((n, 1)), 1).reshape((n,))
    loss = UOp(MUL, (-UOp(Ops.WHERE, (keep, picked, broadcast_uop(const_uop(0.0, dtypes.f32), (n,)))), w))
    return self._new(UOp(MUL, (loss.reduce(ADD, 1), UOp(Ops.RECIP, (w.reduce(ADD, 1),)))))
  def sparse_categorical_crossentropy(self, target: TensorCore, ignore_index: int = -1, label_smoothing: float = 0.0,
                                      reduction: str = "mean") -> TensorCore:
    """tinygrad's cross entropy with the classes on the last axis of the logits (..., C) and targets (...)."""
    target = target if isinstance(target, TensorCore) else type(self)(target, device=self.device)
    loss = self.reshape(-1, self.shape[-1]).cross_entropy(target.reshape(-1), ignore_index=ignore_index, reduction=reduction,
                                                          label_smoothing=label_smoothing)
    return loss.reshape(target.shape) if reduction == "none" else loss
