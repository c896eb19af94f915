"""uopc.gpt: the course GPT, a decoder-only transformer built from Tensor ops.

    GPT(GPTConfig(vocab=65, context=64, layers=2, width=128, heads=4))(tokens) -> logits (B, T, vocab)

Token and position embeddings, then `layers` pre-LayerNorm blocks (causal self-attention, then a GELU MLP four
times as wide, each added back to the residual stream), a final LayerNorm and the head. Everything is ordinary
Tensor code, so the forward pass, its gradients and the optimizer step are shaped UOp graphs that kernelize and
compile like any other; the step of the configuration above has 421,632 parameters.

State dict names are stable (`wte.weight`, `blocks.0.attn.weight`, `lnf.bias`, `head.weight`, ...): they are the
attribute paths nn.get_state_dict walks, and checkpoints are keyed by them.
"""
from __future__ import annotations
from dataclasses import dataclass
import numpy as np
from uopc.tensor import Tensor, TensorError
from uopc import nn


@dataclass(frozen=True)
class GPTConfig:
  vocab: int = 65
  context: int = 64
  layers: int = 2
  width: int = 128
  heads: int = 4
  dropout: float = 0.0
  tied_head: bool = False       # the head reuses the token embedding's weight

  def __post_init__(self):
    for name in ("vocab", "context", "layers", "width", "heads"):
      v = getattr(self, name)
      if type(v) is not int or v < 1: raise TensorError(f"GPTConfig.{name} must be a positive integer, got {v!r}")
    if self.width % self.heads: raise TensorError(f"GPTConfig: width {self.width} is not divisible by heads {self.heads}")
    if not 0 <= self.dropout < 1: raise TensorError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout}")


class Block:
  """x + attn(ln1(x)), then + mlp(ln2(x)): causal multi-head self-attention and a 4x GELU MLP, pre-LayerNorm."""
  def __init__(self, cfg: GPTConfig):
    self.cfg = cfg
    c = cfg.width
    self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
    self.attn, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)        # q, k and v in one matmul
    self.fc, self.out = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

  def __call__(self, x: Tensor, training: bool = False) -> Tensor:
    B, T, C = x.shape
    H = self.cfg.heads
    q, k, v = self.attn(self.ln1(x)).split(C, dim=-1)
    q, k, v = (t.reshape(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))   # (B, H, T, C/H)
    y = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
    x = x + self.proj(y).dropout(self.cfg.dropout, training)
    return x + self.out(self.fc(self.ln2(x)).gelu()).dropout(self.cfg.dropout, training)


class GPT:
  def __init__(self, cfg: GPTConfig):
    self.cfg = cfg
    self.wte, self.wpe = nn.Embedding(cfg.vocab, cfg.width), nn.Embedding(cfg.context, cfg.width)
    for e in (self.wte, self.wpe): e.weight.assign(e.weight * 0.02).realize()      # GPT-2's N(0, 0.02) embeddings
    self.blocks = [Block(cfg) for _ in range(cfg.layers)]
    self.lnf = nn.LayerNorm(cfg.width)
    self.head = None if cfg.tied_head else nn.Linear(cfg.width, cfg.vocab, bias=False)

  def __call__(self, tokens: Tensor, training: bool = False) -> Tensor:
    """Logits (B, T, vocab) for integer tokens (B, T), T <= context."""
    if tokens.ndim != 2: raise TensorError(f"GPT takes tokens of shape (batch, time), got {tokens.shape}")
    T = tokens.shape[1]
    if T > self.cfg.context: raise TensorError(f"GPT: {T} tokens exceed the context of {self.cfg.context}")
    pos = Tensor(np.arange(T, dtype=np.int32), device=tokens.device)
    x = (self.wte(tokens) + self.wpe(pos)).dropout(self.cfg.dropout, training)
    for block in self.blocks: x = block(x, training)
    x = self.lnf(x)
    return x.linear(self.wte.weight) if self.head is None else self.head(x)

  def parameters(self) -> list[Tensor]: return list(nn.get_state_dict(self).values())

  def loss(self, tokens: Tensor, targets: Tensor, training: bool = True) -> Tensor:
    """Mean cross-entropy of the next-token predictions."""
    logits = self(tokens, training)
    return logits.reshape(-1, self.cfg.vocab).cross_entropy(targets.reshape(-1))


def parameter_count(cfg: GPTConfig) -> int:
  """The number of parameters of GPT(cfg), from the config alone."""
  c, v = cfg.width, cfg.vocab
  block = 2 * 2 * c + (c * 3 * c + 3 * c) + (c * c + c) + (c * 4 * c + 4 * c) + (4 * c * c + c)
  return v * c + cfg.context * c + cfg.layers * block + 2 * c + (0 if cfg.tied_head else v * c)


__all__ = ["GPTConfig", "GPT", "Block", "parameter_count"]
