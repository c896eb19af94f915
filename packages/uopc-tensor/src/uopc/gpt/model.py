"""uopc.gpt.model: the course GPT, a decoder-only transformer built from Tensor ops, and how it generates.

    GPT(GPTConfig(vocab=65, context=64, layers=2, width=128, heads=4))(tokens) -> logits (B, T, vocab)

The model: token and position embeddings, then `layers` pre-LayerNorm blocks (causal self-attention, then a GELU MLP
four times as wide, each added back to the residual stream), a final LayerNorm and the head (its own weights, or the
token embedding's when the head is tied). Everything is ordinary Tensor code, so the forward pass, its gradients and
the optimizer step are shaped UOp graphs that kernelize and compile like any other; the training step is captured
once by uopc.jit and replayed (`training_step`).

Generation is incremental: `GPT.decode` feeds one token per sequence and keeps each layer's keys and values in a cache
of the full context (fixed shapes: the new position is a one-hot row and attention masks the positions not written
yet), so a token costs one position's work and the step is a jit replay. A jit replay writes whole buffers, so the
cache is two: the last few positions (a block of about sqrt(context)) are written into a small cache every token,
and each full block is written into the big one once, when the next block starts (a jit replay of its own): every
token rewrote the whole context's cache before (nanoGPT's, 16 sequences: 12 MB of memory traffic per layer and
token, a third of the step). Attention reads both caches, the big one only as far as it is written, rounded up to a
quarter of the context (a jitted step for each quarter: `cache_prefix`). Past the context it goes on with a sliding
window, as nanoGPT does: each new token is conditioned on the last `context` tokens, each at its place in the window.
The window's position embeddings move with every token, so no cached key or value stays valid: `GPT.window_logits` is
a full forward pass of the window (a jit replay too), the cache rebuilt in effect. `generate` drives both.

State dict names are stable (`wte.weight`, `blocks.0.attn.weight`, `lnf.bias`, `head.weight`, ...): the attribute
paths nn.get_state_dict walks; `parameter_shapes` lists them from a config alone.
"""
from __future__ import annotations
import functools, math
from dataclasses import dataclass
import numpy as np
from uopc.tensor import Tensor, TensorError
from uopc.jit import jit
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
    if type(self.dropout) not in (int, float) or not 0 <= self.dropout < 1:
      raise TensorError(f"GPTConfig.dropout must be a number in [0, 1), got {self.dropout!r}")
    if type(self.tied_head) is not bool: raise TensorError(f"GPTConfig.tied_head must be True or False, got {self.tied_head!r}")


class Block:
  """x + attn(ln1(x)), then + mlp(ln2(x)): causal multi-head self-attention and a 4x GELU MLP, pre-LayerNorm."""
  def __init__(self, cfg: GPTConfig):
    self.cfg = cfg
    c = cfg.width
    self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
    self.attn, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)        # q, k and v in one matmul
    self.fc, self.out = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

  def _heads(self, t: Tensor) -> Tensor:   # (B, T, C) -> (B, H, T, C/H)
    B, T, C = t.shape
    return t.reshape(B, T, self.cfg.heads, C // self.cfg.heads).transpose(1, 2)

  def _mlp(self, x: Tensor, training: bool) -> Tensor:
    return x + self.out(self.fc(self.ln2(x)).gelu()).dropout(self.cfg.dropout, training)

  def __call__(self, x: Tensor, training: bool = False) -> Tensor:
    B, T, C = x.shape
    q, k, v = (self._heads(t) for t in self.attn(self.ln1(x)).split(C, dim=-1))
    y = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
    return self._mlp(x + self.proj(y).dropout(self.cfg.dropout, training), training)

  def decode(self, x: Tensor, at: Tensor, seen: tuple[Tensor, Tensor], cache: tuple[Tensor, Tensor, Tensor, Tensor]) -> Tensor:
    """One position per sequence: x (B, 1, C); `at` (1, 1, S, 1) is the position's one-hot in the recent block, `seen`
    the positions written so far (this one included) in the big cache (1, 1, 1, T) and in the recent block (1, 1, 1,
    S). The new key and value are written into the recent block's caches (the last two of `cache`) at `at`."""
    B, _, C = x.shape
    q, k, v = (self._heads(t) for t in self.attn(self.ln1(x)).split(C, dim=-1))   # (B, H, 1, C/H)
    K, V, Kr, Vr = cache
    Kr.assign(at.where(k, Kr))
    Vr.assign(at.where(v, Vr))
    scale = 1 / math.sqrt(C // self.cfg.heads)
    att = Tensor.cat(seen[0].where((q @ K.transpose(-1, -2)) * scale, float("-inf")),
                     seen[1].where((q @ Kr.transpose(-1, -2)) * scale, float("-inf")), dim=-1).softmax(-1)   # (B, H, 1, T + S)
    T = K.shape[2]
    y = att[..., :T] @ V + att[..., T:] @ Vr
    return self._mlp(x + self.proj(y.transpose(1, 2).reshape(B, 1, C)), False)


# from this context on, a decode step reads only the filled part of the big cache, rounded up to a quarter of the context
# (a jitted step per quarter): nanoGPT's 16 sequences read 75 MB of keys and values a token at every position, 44 on
# average this way (uopc/torch 0.77x -> 1.05x, 2,955 tokens/s beside torch's 2,802; the default model's batch of 16,
# 0.99x -> 1.08x). Below it, one step reads the whole cache (fewer kernels to compile for a tiny model).
PREFIX_BUCKETS_FROM = 64
PREFIX_BUCKETS = 4


def cache_prefix(context: int, block: int, position: int) -> int:
  """The positions of the big cache a decode step at `position` reads: the full blocks written so far (position //
  block of them), rounded up to a multiple of a PREFIX_BUCKETS-th of the context (at least one), or the whole context
  below PREFIX_BUCKETS_FROM."""
  if context < PREFIX_BUCKETS_FROM: return context
  per = -(-(context // block) // PREFIX_BUCKETS)           # blocks in a bucket
  return min(context, max(1, -(-(position // block) // per)) * per * block)


@functools.lru_cache(maxsize=64)
def recent_block(context: int) -> int:
  """Positions in the decode cache's recent block: the largest divisor of the context up to its square root (a token
  rewrites the block, and a block's end writes it into the full cache: sqrt balances the two)."""
  return max(d for d in range(1, math.isqrt(context) + 1) if context % d == 0)


class _Decoders:
  """Batch size -> (the jitted decode step, its key/value caches), and batch size -> the jitted forward pass of a full
  window. Scratch, not parameters: a class with __slots__ and no __dict__, so nn.get_state_dict (which walks attributes,
  lists and dicts) never sees the caches."""
  __slots__ = ("by_batch", "windows")
  def __init__(self): self.by_batch, self.windows = {}, {}


class GPT:
  def __init__(self, cfg: GPTConfig):
    self.cfg = cfg
    self.wte, self.wpe = nn.Embedding(cfg.vocab, cfg.width), nn.Embedding(cfg.context, cfg.width)
    # GPT-2's N(0, 0.02) embeddings, realized in one schedule (one compile for both, with a cold cache)
    Tensor.realize(*(e.weight.assign(e.weight * 0.02) for e in (self.wte, self.wpe)))
    self.blocks = [Block(cfg) for _ in range(cfg.layers)]
    self.lnf = nn.LayerNorm(cfg.width)
    self.head = None if cfg.tied_head else nn.Linear(cfg.width, cfg.vocab, bias=False)
    self._decoders = _Decoders()

  def _logits(self, x: Tensor) -> Tensor:
    x = self.lnf(x)
    return x.linear(self.wte.weight) if self.head is None else self.head(x)

  def _hidden(self, tokens: Tensor, training: bool) -> Tensor:
    """The residual stream (B, T, width) after the last block."""
    if tokens.ndim != 2: raise TensorError(f"GPT takes tokens of shape (batch, time), got {tokens.shape}")
    T = tokens.shape[1]
    if T > self.cfg.context: raise TensorError(f"GPT: {T} tokens exceed the context of {self.cfg.context}")
    pos = Tensor(np.arange(T, dtype=np.int32), device=tokens.device)
    x = (self.wte(tokens) + self.wpe(pos)).dropout(self.cfg.dropout, training)
    for block in self.blocks: x = block(x, training)
    return x

  def __call__(self, tokens: Tensor, training: bool = False) -> Tensor:
    """Logits (B, T, vocab) for integer tokens (B, T), T <= context."""
    return self._logits(self._hidden(tokens, training))

  def parameters(self) -> list[Tensor]: return list(nn.get_state_dict(self).values())

  def loss(self, tokens: Tensor, targets: Tensor, training: bool = True) -> Tensor:
    """Mean cross-entropy of the next-token predictions; a target of -100 is not predicted (a prompt's digits)."""
    logits = self(tokens, training)
    return logits.reshape(-1, self.cfg.vocab).cross_entropy(targets.reshape(-1), ignore_index=-100)

  def decode(self, tokens: np.ndarray, position: int) -> np.ndarray:
    """Logits (B, vocab) for the next token after feeding `tokens` (B,) at `position`, every earlier position of these B
    sequences having been fed before (in order, from 0). A jit replay per call after the first two of a batch size."""
    B, T, C = len(tokens), self.cfg.context, self.cfg.width
    if not 0 <= position < T: raise TensorError(f"GPT.decode: position {position} is outside the context of {T}")
    decoders = self._decoders.by_batch
    S = recent_block(T)
    if B not in decoders:
      H = self.cfg.heads
      zeros = lambda n: Tensor(np.zeros((B, H, n, C // H), np.float32))     # buffers of their own, no fill kernel
      caches = [(zeros(T), zeros(T), zeros(S), zeros(S)) for _ in self.blocks]
      def stepper(L: int):
        def step(tok: Tensor, pos: Tensor) -> Tensor:
          """The logits after tokens `tok` (B, 1) at position `pos` (1,), reading the first L positions of the big cache
          (every one written so far): the masks are made from `pos` in the graph (a tensor made from NumPy costs more per
          token than the kernels of a small model's step)."""
          t, r, in_block = Tensor.arange(T), Tensor.arange(S), pos % S
          x = self.wte(tok) + ((t == pos).float().reshape(1, T) @ self.wpe.weight).reshape(1, 1, C)
          at = (r == in_block).reshape(1, 1, S, 1)
          seen = ((Tensor.arange(L) < pos - in_block).reshape(1, 1, 1, L), (r <= in_block).reshape(1, 1, 1, S))
          for block, (K, V, Kr, Vr) in zip(self.blocks, caches):
            x = block.decode(x, at, seen, (K[:, :, :L], V[:, :, :L], Kr, Vr) if L < T else (K, V, Kr, Vr))
          return self._logits(x).reshape(B, self.cfg.vocab)
        return jit(step)
      def flush(block: Tensor) -> None:
        """Write the recent block's keys and values into the full caches at block `block` (a one-hot of T // S)."""
        for K, V, Kr, Vr in caches:
          for full, recent in ((K, Kr), (V, Vr)):
            blocks = full.reshape(B, H, T // S, S, C // H)
            full.assign(block.reshape(1, 1, T // S, 1, 1).where(recent.reshape(B, H, 1, S, C // H), blocks).reshape(B, H, T, C // H))
      decoders[B] = (stepper, {}, jit(flush))
    stepper, steps, flush = decoders[B]
    if position and position % S == 0: flush(Tensor(np.arange(T // S) == position // S - 1))
    L = cache_prefix(T, S, position)
    if L not in steps: steps[L] = stepper(L)
    logits = steps[L](Tensor(np.asarray(tokens, np.int32).reshape(B, 1)), Tensor(np.array([position], np.int32)))
    return logits.numpy()

  def window_logits(self, tokens: np.ndarray) -> np.ndarray:
    """Logits (B, vocab) for the next token after a full window `tokens` (B, context): what generation past the context
    conditions on. A full forward pass (the head on the last position only), jitted by batch size: sliding the window
    moves every token's position embedding, so the decode caches can't be shifted, only rebuilt, and this is that."""
    B, T = np.shape(tokens)
    if T != self.cfg.context: raise TensorError(f"GPT.window_logits takes a window of the context's {self.cfg.context} tokens, got {T}")
    windows = self._decoders.windows
    if B not in windows: windows[B] = jit(lambda t: self._logits(self._hidden(t, False)[:, -1]))
    return windows[B](Tensor(np.asarray(tokens, np.int32))).numpy()


def training_step(model: GPT, opt: nn.Optimizer):
  """The training step under uopc.jit: (tokens, next tokens) -> the loss, after one step of `opt` (captured on its second
  call, replayed after that). Under MPI with more than one rank (uopc.distributed) the tokens are this rank's shard of
  the batch, and the step is two jitted parts with the allreduce between them (a replay runs kernels only, it can't
  call MPI): the forward and backward, then the mean of the loss and the gradients over the ranks, then the update,
  the same on every rank; the step takes a third argument, the shard's share of the batch's targets, so that the
  loss and gradients are the whole batch's (an addition's examples predict answers of different lengths)."""
  from uopc import distributed
  if distributed.world_size() == 1:
    @jit
    def step(x: Tensor, y: Tensor) -> Tensor:
      opt.zero_grad()
      loss = model.loss(x, y)
      loss.backward()
      opt.step()
      return loss
    return step

  world = distributed.world_size()
  @jit
  def gradients(x: Tensor, y: Tensor, weight: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model.loss(x, y) * weight
    loss.backward()
    return loss
  @jit
  def update() -> None: opt.step()
  def step(x: Tensor, y: Tensor, share: float | None = None) -> Tensor:
    """`share`: this shard's part of the batch's predicted targets (1 / world size when every shard has as many). Each
    rank's mean loss is weighted by it, so the mean over the ranks is the whole batch's mean, and so are the gradients."""
    loss = gradients(x, y, Tensor(np.float32(1.0 if share is None else world * share)))
    distributed.allreduce([loss] + [p.grad for p in opt.params if p.grad is not None])
    update()
    return loss
  return step


def parameter_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
  """The state dict names of GPT(cfg) and their shapes, in its order, from the config alone: load checks a checkpoint's
  tensors against them before it builds a model (a damaged width of 10**9 must not allocate first)."""
  c, v = cfg.width, cfg.vocab
  shapes = {"wte.weight": (v, c), "wpe.weight": (cfg.context, c)}
  for i in range(cfg.layers):
    linears = {"attn": (3 * c, c), "proj": (c, c), "fc": (4 * c, c), "out": (c, 4 * c)}      # nn.Linear's (out, in)
    for name in ("ln1", "ln2", "attn", "proj", "fc", "out"):
      out_in = linears.get(name, (c,))
      shapes[f"blocks.{i}.{name}.weight"], shapes[f"blocks.{i}.{name}.bias"] = out_in, out_in[:1]
  shapes["lnf.weight"], shapes["lnf.bias"] = (c,), (c,)
  if not cfg.tied_head: shapes["head.weight"] = (v, c)
  return shapes


def parameter_count(cfg: GPTConfig) -> int:
  """The number of parameters of GPT(cfg), from the config alone."""
  return sum(math.prod(shape) for shape in parameter_shapes(cfg).values())


def generate(model: GPT, prompts: np.ndarray, tokens: int, temperature: float = 1.0, top_k: int | None = None,
             rng: np.random.Generator | None = None) -> np.ndarray:
  """`tokens` new tokens after each prompt (B, L) (all prompts the same length). While the sequence fits the context,
  one position at a time through the decode cache; past it, each token is conditioned on the last `context` tokens (a
  sliding window, GPT.window_logits), as is a prompt longer than the context. temperature 0 is greedy; top_k keeps the
  k likeliest tokens before sampling."""
  if np.ndim(prompts) != 2 or 0 in np.shape(prompts):
    raise TensorError(f"generate takes prompts of shape (batch, length >= 1), got {np.shape(prompts)}")
  if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or tokens < 0:
    raise TensorError(f"generate: tokens must be an int >= 0, got {tokens!r}")
  (B, L), T = prompts.shape, model.cfg.context
  rng = rng or np.random.default_rng(0)
  seq = np.zeros((B, L + tokens), np.int32)
  seq[:, :L] = prompts
  if L <= T:
    for pos in range(L): logits = model.decode(seq[:, pos], pos)
  else: logits = model.window_logits(seq[:, L - T:L])
  for n in range(L, L + tokens):           # n: the position of the token being chosen
    if temperature <= 0: seq[:, n] = logits.argmax(-1)
    else:
      z = logits.astype(np.float64) / temperature
      if top_k: z = np.where(z >= np.sort(z, -1)[:, -min(top_k, z.shape[-1]), None], z, -np.inf)
      p = np.exp(z - z.max(-1, keepdims=True))
      p /= p.sum(-1, keepdims=True)
      seq[:, n] = [rng.choice(len(q), p=q) for q in p]
    if n + 1 == L + tokens: break
    logits = model.decode(seq[:, n], n) if n < T else model.window_logits(seq[:, n + 1 - T:n + 1])
  return seq[:, L:]
