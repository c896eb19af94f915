"""uopc.tensor: the frontend. Tensor is a thin, lazy layer that builds shaped UOp graphs as you call methods.

A Tensor holds one shaped UOp. Nothing runs until a value is asked for: `realize()` (or numpy/item/tolist)
kernelizes the graph, lowers and compiles each kernel (cached by its structure, so a training loop compiles once),
runs the kernels on the backend, and replaces the tensor's graph by the BUFFER that holds its value.
`schedule()` returns the kernels realize() would run, without running them.

Everything is the IR's primitives: broadcasting is RESHAPE + EXPAND, a reduction over any axes is a PERMUTE
that moves them last and a REDUCE, `x - y` is `x + y*-1`, exp is exp2, a gather with an integer Tensor is a
one-hot mask and a sum, a convolution is a window view (movement ops only) times the weights, summed. The
gradients come from uopc.grad on the same graph, so backward passes fuse and compile like forward ones.
What the IR has no primitive for is a composite in fixed shapes: & | ^ on i32 take the 32 bits apart, a product
halves its axis pairwise, a cumulative op reduces triangular blocks, sort counts each element's rank, min is max
under -1 - x (no overflow at INT_MIN). Where PyTorch's gradient is a formula of its own at the edges (pow at 0 and
infinity, erf, binary_cross_entropy), value and slope are computed apart and joined by `_with_gradient`.

Conventions follow PyTorch, and tinygrad's where they differ and the IR's sugar agrees: `cond.where(a, b)`,
`max(axis)` returns values only, `pad(((before, after), ...))` takes numpy.pad's pairs (and F.pad's flat tuple),
`Tensor.cat(*ts, dim=)`, `layernorm` has no affine parameters, `gelu` is the tanh approximation, `//` on integers
floors. Dtypes promote bool < i32 < f16 < f32; a python scalar adopts the tensor's dtype (a float scalar with an
integer tensor gives f32). f16 tensors are stored in f16 but summed, multiplied and put through the math functions in
f32, rounded to f16 once (`f16_in_f32`), as torch and NumPy compute them. Errors name the shapes and are of the kinds
torch raises: TensorError is a ValueError and a RuntimeError, TensorIndexError an IndexError, TensorTypeError a
TypeError.

Tensor is composed here, as tinygrad composes its own, from TensorCore (uopc.tensor.core: the state, realize,
reading values, assign, autograd's entry, broadcasting) and one mixin per theme, each in its module:

    creation        full, zeros, arange, eye, rand, randn, dropout      reduce          sum, max, mean, var, prod, argmax, cumsum
    elementwise     + - * / // % comparisons bits where clip round     movement        reshape, permute, pad, cat, stack, roll
    transcendental  exp, log, sin, cos, tanh, erf, pow                 indexing        t[idx], gather, scatter, masked_select
    activations     relu, gelu, silu, sigmoid, elu, softplus            sorting         sort, argsort, topk
    matmul          @, matmul, linear, einsum                          conv            conv2d, conv_transpose2d
    pooling         max_pool2d, avg_pool2d, interpolate                losses          cross_entropy, mse_loss, nll_loss
    attention       scaled_dot_product_attention                       normalization   softmax, layernorm, normalize

Below them: errors (the exception classes), args (argument checks, dtype promotion, broadcast_shape), storage (the
data behind realized tensors) and capture (the hook uopc.jit records a call through; the whole surface it uses).
"""
from uopc.tensor.errors import TensorError, TensorIndexError, TensorTypeError, JitError
from uopc.tensor.args import broadcast_shape
from uopc.tensor.storage import name_buffer, named, realize_lazy_state, tune_collector
from uopc.tensor.capture import Capture, capturing, IndexCheck
from uopc.tensor.core import TensorCore, ValuesIndices
from uopc.tensor.creation import CreationMixin
from uopc.tensor.elementwise import ElementwiseMixin
from uopc.tensor.transcendental import TranscendentalMixin
from uopc.tensor.activations import ActivationMixin
from uopc.tensor.reduce import ReduceMixin
from uopc.tensor.movement import MovementMixin
from uopc.tensor.indexing import IndexingMixin
from uopc.tensor.sorting import SortingMixin
from uopc.tensor.matmul import MatmulMixin
from uopc.tensor.conv import ConvMixin
from uopc.tensor.pooling import PoolingMixin
from uopc.tensor.losses import LossMixin
from uopc.tensor.attention import AttentionMixin
from uopc.tensor.normalization import NormalizationMixin


class Tensor(CreationMixin, ElementwiseMixin, TranscendentalMixin, ActivationMixin, ReduceMixin, MovementMixin, IndexingMixin, SortingMixin,
             MatmulMixin, ConvMixin, PoolingMixin, LossMixin, AttentionMixin, NormalizationMixin, TensorCore):
  """A lazy n-dimensional array: a shaped UOp graph, computed on `realize()`."""
  __slots__ = ()


tune_collector()   # a step's graph is thousands of short-lived objects: see uopc.tensor.storage.GC_THRESHOLD


__all__ = ["Tensor", "TensorError", "TensorIndexError", "TensorTypeError", "JitError", "broadcast_shape", "ValuesIndices", "Capture",
           "capturing", "IndexCheck", "name_buffer", "named", "realize_lazy_state"]
