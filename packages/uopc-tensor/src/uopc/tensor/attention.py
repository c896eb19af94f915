"""uopc.tensor.attention: scaled dot-product attention, softmax(q @ k^T * scale + mask) @ v, as torch's.

Ordinary Tensor ops (two matmuls, a masked softmax, dropout), so its forward and backward passes are graphs the
kernelizer fuses like any other. f16 inputs are computed in f32 and rounded once: f16 scores rounded
before the softmax were 10x further off. With enable_gqa, key and value heads are shared by groups of query heads.

A long causal attention (f32, no other mask, no dropout: the common case _attention_uops builds) is computed in blocks
of queries (_causal_blocks): the block of queries [s, e) sees keys [0, e) only, so the scores above the diagonal
blocks, which the mask would zero, are never computed, nor multiplied by v, nor differentiated: 10/16 of the work in 4
blocks. What torch's fused kernels skip the same way. (With dropout the blocks would draw their random numbers in
another order than the whole does, so that road keeps one block.)
"""
from __future__ import annotations
import math
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops
from uopc.tensor.errors import TensorError
from uopc.tensor.args import promote
from uopc.tensor.core import TensorCore, broadcast_uop
from uopc.tensor.creation import const_uop, triangle
from uopc.tensor.normalization import softmax_last_uop


CAUSAL_BLOCK = 64          # queries per block of a causal attention, at least (see _causal_blocks)
MAX_CAUSAL_BLOCKS = 4


class AttentionMixin:
  """scaled_dot_product_attention."""
  __slots__ = ()

  def scaled_dot_product_attention(self, key: TensorCore, value: TensorCore, attn_mask: TensorCore | None = None, dropout_p: float = 0.0,
                                   is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> TensorCore:
    """softmax(q @ k^T * scale + mask) @ v, with q = self (..., L, E), key (..., S, E), value (..., S, Ev). With enable_gqa,
    key and value may have fewer heads (axis -3) than the query, each shared by a group of query heads."""
    key, value = self._tensor_arg(key, "attention: key"), self._tensor_arg(value, "attention: value")
    if attn_mask is None and dropout_p == 0 and (scale is None or type(scale) is float):
      if is_causal and (fast := self._causal_blocks(key, value, scale)) is not None: return fast
      if (fast := self._attention_uops(key, value, is_causal, scale)) is not None: return fast
    if promote(self.dtype, key.dtype, value.dtype) is dtypes.f16:   # in f32, rounded once (see f16_in_f32): f16 scores
      f32 = self.float().scaled_dot_product_attention(key.float(), value.float(), attn_mask, dropout_p, is_causal, scale, enable_gqa)
      return f32.half()                                               # rounded before the softmax were 10x further off
    if attn_mask is not None: attn_mask = self._tensor_arg(attn_mask, "attention: attn_mask")
    if is_causal and attn_mask is not None: raise TensorError("attention: give attn_mask or is_causal, not both (as torch)")
    if self.ndim < 2 or key.ndim < 2 or value.ndim < 2:
      raise TensorError(f"attention: query {self.shape}, key {key.shape}, value {value.shape} must be at least 2-D")
    if enable_gqa and self.ndim >= 3 and key.ndim >= 3 and key.shape[-3] != self.shape[-3]:
      hq, hk = self.shape[-3], key.shape[-3]
      if hk == 0 or hq % hk or value.shape[-3] != hk:
        raise TensorError(f"attention: {hq} query heads can't share {hk} key heads ({value.shape[-3]} value heads)")
      key, value = key.repeat_interleave(hq // hk, -3), value.repeat_interleave(hq // hk, -3)
    if self.shape[-1] != key.shape[-1]: raise TensorError(f"attention: query {self.shape} and key {key.shape} disagree on the last axis")
    L, S = self.shape[-2], key.shape[-2]
    s = (self @ key.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(self.shape[-1]))
    if is_causal:
      s = triangle(self, L, S).where(s, float("-inf"))
    if attn_mask is not None: s = attn_mask.where(s, float("-inf")) if attn_mask.dtype is dtypes.bool else s + attn_mask
    return s.softmax(-1).dropout(dropout_p) @ value

  def _causal_blocks(self, key: TensorCore, value: TensorCore, scale: float | None) -> TensorCore | None:
    """Causal attention of CAUSAL_BLOCK queries or more per block, in blocks (at most MAX_CAUSAL_BLOCKS, the last may be
    shorter): the queries [s, e) against the keys [0, min(e, S)) under the causal mask shifted by s, the blocks joined
    along the queries. None where there would be one block, or where _attention_uops declines (the general road then).

    The join is materialized (contiguous): the consumer of attention's output (a projection's GEMM) read it as a
    concatenation inside its loops, a branch per element, and ran at half its speed (nanoGPT's step: 4 blocks saved 15
    ms a step that way, 45 with the join in a buffer of its own, 655-663 -> 612-618 ms). A block of 32 queries costs more
    than it saves (the default GPT, context 64, in 2 blocks: 16.1 -> 16.8 ms a step; 4 blocks of 64 at 256 is the best
    of 2, 4 and 8)."""
    L = self.shape[-2] if self.ndim >= 2 else 0
    if (blocks := min(L // CAUSAL_BLOCK, MAX_CAUSAL_BLOCKS)) < 2: return None
    rows = -(-L // blocks)
    pieces = []
    for s in range(0, L, rows):
      e = min(s + rows, L)
      piece = self.shrink((None,) * (self.ndim - 2) + ((s, e), None))._attention_uops(key, value, True, scale, diagonal=s, keys=e)
      if piece is None: return None
      pieces.append(piece)
    return type(self).cat(*pieces, dim=-2).contiguous()

  def _attention_uops(self, key: TensorCore, value: TensorCore, is_causal: bool, scale: float | None, diagonal: int = 0,
                      keys: int | None = None) -> TensorCore | None:
    """scaled_dot_product_attention's common case, f32 query, key and value of one batch shape on one device with no
    mask but the causal one, straight to UOps past the two matmuls: the graph of the Tensor ops above (the scaled scores,
    the mask's WHERE, softmax), node for node (a test holds them to it), for half of their Python (a GPT's two were 0.3
    ms of each plain step's forward). None otherwise.

    A block of queries starting at `diagonal` (_causal_blocks) sees the keys up to its position + `diagonal`, and only
    the first `keys` keys and values are read. Each is shrunk in the layout in which its gradient comes back, so that
    the blocks' gradients meet (a sum of padded pieces) in the layout their GEMMs wrote them in: the key as given (its
    gradient, ds.T @ q, is computed (keys, head dim)), the value transposed (p.T @ dy comes back (head dim, keys): a
    matmul's second operand is read as its transpose). Shrunk in the other layout, the sum read each piece transposed,
    a gather per lane (nanoGPT's value gradient: 1.15 ms a layer at 96 GFLOP/s; a causal attention's forward and
    backward at nanoGPT's shape, the key shrunk transposed: 12.8-13.7 ms, as given: 12.3-12.7)."""
    q, k, v = self.uop, key.uop, value.uop
    qs, ks, vs = q.shape, k.shape, v.shape
    n = len(qs)
    if n < 2 or len(ks) != n or len(vs) != n or not (q.dtype is k.dtype is v.dtype is dtypes.f32) or qs[:-2] != ks[:-2] or \
       ks[:-2] != vs[:-2] or qs[-1] != ks[-1] or ks[-2] != vs[-2] or 0 in qs or 0 in ks or 0 in vs or \
       not self.device == key.device == value.device: return None
    swap = tuple(range(n - 2)) + (n - 1, n - 2)
    if keys is not None and keys < ks[-2]:
      k = k.shrink(tuple((0, d) for d in ks[:-2]) + ((0, keys), (0, ks[-1])))            # the first `keys` keys
      v = v.permute(swap).shrink(tuple((0, d) for d in vs[:-2]) + ((0, vs[-1]), (0, keys))).permute(swap)   # ... transposed
    kt = k.permute(swap)                                                                          # key.transpose(-1, -2)
    s = self._same_batch_matmul(key._new(kt))
    u = s.uop
    u = UOp(Ops.MUL, (u, u.const_like(scale if scale is not None else 1 / math.sqrt(qs[-1]))))
    shape = u.shape
    if is_causal:
      causal = triangle(self, qs[-2], kt.shape[-1], diagonal).uop
      u = UOp(Ops.WHERE, (broadcast_uop(causal, shape), u, broadcast_uop(const_uop(float("-inf"), dtypes.f32), shape)))
    return s._new(softmax_last_uop(u))._same_batch_matmul(value if v is value.uop else value._new(v))
