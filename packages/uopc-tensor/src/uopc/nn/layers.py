"""uopc.nn.layers: the layers, plain objects whose Tensor attributes are their parameters.

Calling a layer runs its forward pass with Tensor ops; there is no Module base class, no registration and no hooks:
nn.get_state_dict finds the parameters by walking the attributes. Layouts and initializations are PyTorch's (Linear's
weight is (out, in), Conv2d's (out, in/groups, kh, kw), both U(-1/sqrt(fan_in), 1/sqrt(fan_in))), so a torch state dict
loads into the same shapes. Sizes and hyperparameters are checked where a layer is made, each error naming the value.
"""
from __future__ import annotations
import math
import numpy as np
from uopc.tensor import Tensor, TensorError
from uopc.tensor.args import check_window_args
from uopc.nn.optim import hyperparameter


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
    self.eps = hyperparameter("eps", eps)
    self.weight = Tensor.ones(*self.shape, requires_grad=True) if elementwise_affine else None
    self.bias = Tensor.zeros(*self.shape, requires_grad=True) if elementwise_affine else None
  def __call__(self, x: Tensor) -> Tensor:
    if x.shape[-len(self.shape):] != self.shape: raise TensorError(f"LayerNorm{self.shape} applied to a tensor of shape {x.shape}")
    if len(self.shape) == 1 and (fast := x._layernorm_uops(self.eps, self.weight, self.bias)) is not None: return fast
    y = x.layernorm(tuple(range(-len(self.shape), 0)), self.eps)
    return y * self.weight + self.bias if self.weight is not None else y


class Conv2d:
  """torch.nn.Conv2d: weight (out, in/groups, kh, kw) and bias initialized U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int], stride=1, padding=0, dilation=1,
               groups: int = 1, bias: bool = True):
    _sizes("Conv2d", in_channels=in_channels, out_channels=out_channels)
    check_window_args("Conv2d", kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation, groups=groups)
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
