"""uopc.gpt: the course GPT, a decoder-only transformer built from Tensor ops, its tasks, training and sampling.

    GPT(GPTConfig(vocab=65, context=64, layers=2, width=128, heads=4))(tokens) -> logits (B, T, vocab)
    uopc gpt train [--task addition | --data FILE] ...      train, save DIR/model.safetensors and DIR/loss.png
    uopc gpt sample DIR --prompt "12+34="                    continue a prompt with a trained model

The model: token and position embeddings, then `layers` pre-LayerNorm blocks (causal self-attention, then a GELU MLP
four times as wide, each added back to the residual stream), a final LayerNorm and the head (its own weights, or the
token embedding's when the head is tied). Everything is ordinary Tensor code, so the forward pass, its gradients and
the optimizer step are shaped UOp graphs that kernelize and compile like any other; the training step is captured
once by uopc.jit and replayed.

Generation is incremental: `GPT.decode` feeds one token per sequence and keeps each layer's keys and values in a cache
of the full context (fixed shapes: the new position is a one-hot row and attention masks the positions not written
yet), so a token costs one position's work and the step is a jit replay. Past the context it goes on with a sliding
window, as nanoGPT does: each new token is conditioned on the last `context` tokens, each at its place in the window.
The window's position embeddings move with every token, so no cached key or value stays valid: `GPT.window_logits` is
a full forward pass of the window (a jit replay too), the cache rebuilt in effect.

State dict names are stable (`wte.weight`, `blocks.0.attn.weight`, `lnf.bias`, `head.weight`, ...): the attribute
paths nn.get_state_dict walks. A checkpoint is one .safetensors file that the safetensors library reads: the model's
tensors, the optimizer's (`optim.*`), and in its metadata the config, the task and the training history.
"""
from __future__ import annotations
import argparse, json, math, os, sys, time
from dataclasses import dataclass, asdict, fields as dataclass_fields
from pathlib import Path
import numpy as np
from uopc.tensor import Tensor, TensorError
from uopc.jit import jit
from uopc import nn

FORMAT = "uopc-gpt-1"


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

  def decode(self, x: Tensor, at: Tensor, seen: Tensor, cache: tuple[Tensor, Tensor]) -> Tensor:
    """One position per sequence: x (B, 1, C); `at` (1, 1, T, 1) is the position one-hot, `seen` (1, 1, 1, T) the
    positions written so far (this one included). The new key and value are written into the caches at `at`."""
    B, _, C = x.shape
    q, k, v = (self._heads(t) for t in self.attn(self.ln1(x)).split(C, dim=-1))   # (B, H, 1, C/H)
    K, V = cache
    K.assign(at.where(k, K))
    V.assign(at.where(v, V))
    att = (q @ K.transpose(-1, -2)) * (1 / math.sqrt(C // self.cfg.heads))         # (B, H, 1, T)
    y = seen.where(att, float("-inf")).softmax(-1) @ V
    return self._mlp(x + self.proj(y.transpose(1, 2).reshape(B, 1, C)), False)


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
    for e in (self.wte, self.wpe): e.weight.assign(e.weight * 0.02).realize()      # GPT-2's N(0, 0.02) embeddings
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
    if B not in decoders:
      H = self.cfg.heads
      caches = [(Tensor.zeros(B, H, T, C // H).realize(), Tensor.zeros(B, H, T, C // H).realize()) for _ in self.blocks]
      def step(tok: Tensor, at: Tensor, seen: Tensor) -> Tensor:
        x = self.wte(tok) + (at.reshape(1, T) @ self.wpe.weight).reshape(1, 1, C)
        for block, cache in zip(self.blocks, caches): x = block.decode(x, at.reshape(1, 1, T, 1), seen.reshape(1, 1, 1, T), cache)
        return self._logits(x).reshape(B, self.cfg.vocab)
      decoders[B] = (jit(step), caches)
    step, _ = decoders[B]
    onehot = np.zeros(T, np.float32)
    onehot[position] = 1
    logits = step(Tensor(np.asarray(tokens, np.int32).reshape(B, 1)), Tensor(onehot), Tensor(np.arange(T) <= position))
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
  call, replayed after that)."""
  @jit
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model.loss(x, y)
    loss.backward()
    opt.step()
    return loss
  return step


# A run's random streams, one per purpose, all from its seed. numpy pads short entropy with zeros, so default_rng([seed, 0])
# *is* default_rng(seed): training batches drawn from default_rng([seed, step]) repeated, at step 0, AdditionTask's
# held-out draw; for 3 digits and more every problem was skipped, and the empty batch's loss (0/0) read as a diverged
# run. A SeedSequence spawn key keeps each stream apart from the held-out one and from the others.
TRAIN_STREAM, VAL_STREAM = 1, 2


def data_rng(seed: int, stream: int, *more: int) -> np.random.Generator:
  """The generator of one stream of a run (TRAIN_STREAM and the step a run starts at, or VAL_STREAM) for `seed`."""
  return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream, *more)))


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


# ---- tasks: what the model learns ------------------------------------------------------------------------------------

class AdditionTask:
  """Additions written as text, "7+45=52\\n": operands below 10**digits, written as usual (no zero padding). Only the
  answer and the newline after it are predicted (the operands are random); examples shorter than the longest are
  padded after their newline, and the padding is not predicted either. A tenth of all problems (or 2000 of them, when
  there are many) is held out and never trained on; accuracy is the share of held-out problems whose answer greedy
  decoding gets exactly right. The held-out split is drawn from default_rng(seed), so a checkpoint's task seed names it;
  training batches must come from another stream (data_rng), or they would repeat the held-out draw."""
  vocab = "0123456789+=\n"
  EVAL_BATCH = 250              # prompts decoded together when measuring accuracy (one jit capture serves them all)

  def __init__(self, digits: int = 2, seed: int = 0):
    if not 1 <= digits <= 6: raise TensorError(f"--digits must be between 1 and 6, got {digits}")
    self.digits, self.seed = digits, seed
    rng = np.random.default_rng(seed)
    n = 10 ** digits
    if n * n <= 200_000:
      pairs = rng.permutation(n * n)
      cut = max(1, n * n // 10)
      self.heldout, self._train = np.stack(np.divmod(pairs[:cut], n), 1), np.stack(np.divmod(pairs[cut:], n), 1)
      # each operand's length is drawn uniformly, then the number: short operands are as common as long ones (drawn
      # uniformly they are 1 in 10, and the model learns to line up their digits much later)
      numbers_of_length = np.array([10] + [9 * 10 ** (k - 1) for k in range(2, digits + 1)])
      lengths = np.char.str_len(self._train.astype(str))
      w = (1 / numbers_of_length[lengths - 1]).prod(1)
      self._weights = w / w.sum()
    else:     # 2000 distinct problems of a million or more; training draws uniformly and skips them (see batch)
      self.heldout, self._train = np.stack(np.divmod(rng.choice(n * n, 2000, replace=False), n), 1), None
      self._held = set(map(tuple, self.heldout.tolist()))
    self.length = 3 * digits + 4          # the longest example: a+b=c with c one digit longer, and the newline

  def spec(self) -> dict: return {"task": "addition", "digits": self.digits, "seed": self.seed, "vocab": self.vocab}
  def encode(self, text: str) -> list[int]: return [self.vocab.index(c) for c in text]
  def prompt(self, a: int, b: int) -> str: return f"{a}+{b}="

  def batch(self, rng: np.random.Generator, size: int, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), each (size, length - 1): training problems, or held-out ones for split "val"."""
    if split == "val": pairs = self.heldout[rng.integers(0, len(self.heldout), size)]
    elif self._train is not None: pairs = self._train[rng.choice(len(self._train), size, p=self._weights)]
    else:     # uniform draws less the held-out ones, until there are `size`: a batch is always whole
      kept: list = []
      while len(kept) < size: kept += [p for p in rng.integers(0, 10 ** self.digits, (size, 2)).tolist() if tuple(p) not in self._held]
      pairs = np.array(kept[:size])
    x = np.full((size, self.length - 1), self.vocab.index("\n"), np.int32)
    y = np.full((size, self.length - 1), -100, np.int32)
    for i, (a, b) in enumerate(pairs.tolist()):
      p, answer = self.encode(self.prompt(a, b)), self.encode(f"{a + b}\n")
      seq = p + answer
      x[i, :len(seq) - 1] = seq[:-1]
      y[i, len(p) - 1:len(seq) - 1] = answer          # predicted: the answer's digits and its newline
    return x, y

  def accuracy(self, model: GPT, limit: int | None = None) -> float:
    """Share of held-out problems answered exactly by greedy decoding (batched by prompt length, through the decode
    cache, in batches of EVAL_BATCH so that one capture serves every length)."""
    pairs = (self.heldout[:limit] if limit else self.heldout).tolist()
    by_length: dict[int, list] = {}
    for a, b in pairs: by_length.setdefault(len(self.prompt(a, b)), []).append((a, b))
    right = 0
    for group in by_length.values():
      for k in range(0, len(group), self.EVAL_BATCH):
        chunk = group[k:k + self.EVAL_BATCH]
        padded = chunk + [chunk[0]] * (self.EVAL_BATCH - len(chunk))
        prompts = np.array([self.encode(self.prompt(a, b)) for a, b in padded], np.int32)
        out = generate(model, prompts, self.digits + 2, temperature=0.0)
        for (a, b), row in zip(chunk, out.tolist()):
          right += "".join(self.vocab[t] for t in row).split("\n")[0] == str(a + b)
    return right / len(pairs)


class TextTask:
  """Any UTF-8 text, character by character: the vocabulary is the file's characters, the last tenth is validation."""
  def __init__(self, path: str, context: int, seed: int = 0, vocab: str | None = None):
    p = Path(path)
    if not p.is_file(): raise TensorError(f"--data {path}: no such file")
    try: text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError: raise TensorError(f"--data {path}: not UTF-8 text") from None
    if not text: raise TensorError(f"--data {path}: the file is empty")
    self.path, self.seed = str(path), seed
    self.vocab = vocab if vocab is not None else "".join(sorted(set(text)))
    if missing := sorted(set(text) - set(self.vocab)): raise TensorError(f"--data {path}: characters {missing[:5]} are not in the model's vocabulary")
    data = np.array([self.vocab.index(c) for c in text], np.int32)
    cut = int(len(data) * 0.9)
    self.train, self.val = data[:cut], data[cut:]
    self.length = context + 1
    if len(self.train) <= self.length or len(self.val) <= self.length:
      raise TensorError(f"--data {path}: {len(data)} characters are too few for a context of {context} (need {10 * (self.length + 1)} or more)")

  def spec(self) -> dict: return {"task": "text", "data": self.path, "seed": self.seed, "vocab": self.vocab}

  def batch(self, rng: np.random.Generator, size: int, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    data = self.train if split == "train" else self.val
    starts = rng.integers(0, len(data) - self.length, size)
    seqs = np.stack([data[s:s + self.length] for s in starts])
    return seqs[:, :-1], seqs[:, 1:]


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


# ---- checkpoints -------------------------------------------------------------------------------------------------------

class CheckpointError(TensorError):
  """A checkpoint `uopc gpt` can't use; the message names the file and what is wrong with it."""


META_FIELDS = ("config", "task", "step", "lr", "history")       # besides "format", what save writes and load requires
TASK_FIELDS = {"addition": ("task", "digits", "seed", "vocab"), "text": ("task", "data", "seed", "vocab")}   # the tasks' spec()


@dataclass(frozen=True)
class Checkpoint:
  """What load read and checked: the model with its weights, the task spec, the steps trained, the peak learning rate,
  the history ([step, loss, validation loss or None, accuracy or None] a step), and the optimizer's state under AdamW's
  state-dict names (None for a file without one)."""
  path: Path
  model: GPT
  task: dict
  step: int
  lr: float
  history: list
  optimizer: dict | None


def save(path: Path, model: GPT, opt: nn.AdamW, task, step: int, history: list, lr: float) -> None:
  """One .safetensors file: the model's tensors, AdamW's (optim.m.NAME, optim.v.NAME, optim.s1, optim.s2, optim.lr),
  and in the metadata the format, the config, the task's spec, the step, the peak learning rate and the history."""
  state = dict(nn.get_state_dict(model))
  names = list(state)
  for name, p, m, v in zip(names, opt.params, opt.m, opt.v): state[f"optim.m.{name}"], state[f"optim.v.{name}"] = m, v
  state["optim.s1"], state["optim.s2"], state["optim.lr"] = opt._s1, opt._s2, opt._lr
  meta = {"format": FORMAT, "config": json.dumps(asdict(model.cfg)), "task": json.dumps(task.spec()), "step": str(step),
          "lr": repr(lr), "history": json.dumps(history)}
  nn.safe_save(state, path, metadata=meta)


def load(path: Path) -> Checkpoint:
  """The checkpoint file at `path` (see save), checked whole before any of it is used. Each fault is a one-line
  CheckpointError that names the file and the fault (a file that isn't safetensors at all, nn.safe_load's
  SafetensorsError):

    metadata  format, config, task, step, lr and history, each there, JSON and of its type (other keys are ignored: a
              tool may annotate the file); the config has exactly GPTConfig's fields, the task exactly its kind's
              (TASK_FIELDS) and a vocabulary of config.vocab distinct characters (an addition's is AdditionTask's);
    tensors   exactly the model's (parameter_shapes), f32, of their shapes, finite; and the optimizer's either all
              there and in range (optim.m.NAME, optim.v.NAME >= 0, optim.s1 and optim.s2 in [0, 1), optim.lr) or none.

  A file without optimizer state is a checkpoint of the weights alone, not a damaged one (part of the state is
  damage): it samples, and `uopc gpt train --resume` trains on from it with a fresh AdamW and a warning, as a user who
  kept only the weights expects."""
  if not path.is_file(): raise CheckpointError(f"{path}: no checkpoint (expected a model.safetensors written by `uopc gpt train`)")
  tensors, meta = nn.safe_load(path, with_metadata=True)
  def damaged(what: str) -> CheckpointError: return CheckpointError(f"{path}: {what}")
  if meta.get("format") != FORMAT: raise damaged(f"not a uopc GPT checkpoint (its metadata has no format {FORMAT!r})")
  fields = {}
  for key in META_FIELDS:
    if key not in meta: raise damaged(f"its metadata has no {key!r}")
    try: fields[key] = json.loads(meta[key])
    except (ValueError, RecursionError): raise damaged(f"its metadata's {key!r} is not JSON: {meta[key]!r:.60}") from None
  cfg = _checked_config(fields["config"], damaged)
  spec = _checked_task(fields["task"], cfg, damaged)
  step, lr, history = fields["step"], fields["lr"], fields["history"]
  if type(step) is not int or step < 0: raise damaged(f"its step {step!r:.40} is not a whole number >= 0")
  if type(lr) not in (int, float) or not 0 < lr < math.inf: raise damaged(f"its learning rate {lr!r:.40} is not a number above 0")
  _check_history(history, damaged)
  shapes = _checked_model_tensors(tensors, cfg, damaged)
  optimizer = _checked_optimizer_state(tensors, shapes, damaged)
  model = GPT(cfg)
  nn.load_state_dict(model, {name: tensors[name] for name in shapes})
  return Checkpoint(path, model, spec, step, float(lr), history, optimizer)


def _json_kind(v) -> str:
  kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(type(v), "a number")
  return f"{kind} {json.dumps(v)[:40]}" if kind != "an object" else kind


def _checked_config(config, damaged) -> GPTConfig:
  if not isinstance(config, dict): raise damaged(f"its config is {_json_kind(config)}, not an object")
  known = [f.name for f in dataclass_fields(GPTConfig)]
  if missing := [k for k in known if k not in config]: raise damaged(f"its config has no {', '.join(missing)}")
  if extra := sorted(set(config) - set(known)): raise damaged(f"its config has fields GPTConfig doesn't know: {extra[:5]}")
  try: return GPTConfig(**config)
  except TensorError as e: raise damaged(f"its config is damaged: {e}") from None


def _checked_task(spec, cfg: GPTConfig, damaged) -> dict:
  if not isinstance(spec, dict): raise damaged(f"its task is {_json_kind(spec)}, not an object")
  kind = spec.get("task")
  if kind not in TASK_FIELDS: raise damaged(f"its task is {json.dumps(kind)[:40]}, neither \"addition\" nor \"text\"")
  if missing := [k for k in TASK_FIELDS[kind] if k not in spec]: raise damaged(f"its {kind} task has no {', '.join(missing)}")
  if extra := sorted(set(spec) - set(TASK_FIELDS[kind])): raise damaged(f"its {kind} task has fields uopc doesn't know: {extra[:5]}")
  seed, vocab = spec["seed"], spec["vocab"]
  if type(seed) is not int or seed < 0: raise damaged(f"its task's seed {json.dumps(seed)[:40]} is not a whole number >= 0")
  if not isinstance(vocab, str): raise damaged(f"its task's vocabulary is {_json_kind(vocab)}, not a string")
  if len(vocab) != cfg.vocab: raise damaged(f"its task's vocabulary has {len(vocab)} characters, but the model has {cfg.vocab} tokens")
  if len(set(vocab)) != len(vocab): raise damaged(f"its task's vocabulary repeats characters: {vocab!r:.60}")
  if kind == "addition":
    if vocab != AdditionTask.vocab: raise damaged(f"its addition task's vocabulary is {vocab!r:.40}, not {AdditionTask.vocab!r}")
    if type(spec["digits"]) is not int or not 1 <= spec["digits"] <= 6:
      raise damaged(f"its addition task's digits {json.dumps(spec['digits'])[:40]} is not a whole number from 1 to 6")
  elif not isinstance(spec["data"], str) or not spec["data"]:
    raise damaged(f"its text task's data {json.dumps(spec['data'])[:40]} is not a file name")
  return spec


def _check_history(history, damaged) -> None:
  if not isinstance(history, list): raise damaged(f"its history is {_json_kind(history)}, not a list")
  def number(v) -> bool: return type(v) in (int, float) and math.isfinite(v)
  for i, h in enumerate(history):
    if not (isinstance(h, list) and len(h) == 4 and type(h[0]) is int and number(h[1]) and all(v is None or number(v) for v in h[2:])):
      raise damaged(f"its history's entry {i} is {json.dumps(h)[:60]}, not [step, loss, validation loss or null, accuracy or null]")


def _check_tensor(name: str, t: Tensor, shape: tuple, damaged) -> np.ndarray:
  if t.shape != shape: raise damaged(f"tensor {name} has shape {t.shape}, but its config needs {shape}")
  if t.dtype.name != "f32": raise damaged(f"tensor {name} is {t.dtype.name}, not f32")
  values = t.numpy()
  if not np.isfinite(values).all(): raise damaged(f"tensor {name} holds NaN or infinity")
  return values


def _checked_model_tensors(tensors: dict, cfg: GPTConfig, damaged) -> dict:
  """parameter_shapes(cfg), once the file's model tensors are exactly those."""
  held = [k for k in tensors if not k.startswith("optim.")]
  layers_held = len({k.split(".")[1] for k in held if k.startswith("blocks.")})
  if cfg.layers != layers_held:         # before parameter_shapes, which would name the blocks of a layers of 10**9 first
    raise damaged(f"its config has {cfg.layers} layers, but its tensors hold {layers_held}")
  shapes = parameter_shapes(cfg)
  if missing := [k for k in shapes if k not in tensors]: raise damaged(f"the model's tensors {missing[:4]} are missing")
  if extra := [k for k in held if k not in shapes]: raise damaged(f"tensors {extra[:4]} are neither the model's nor the optimizer's")
  for name, shape in shapes.items(): _check_tensor(name, tensors[name], shape, damaged)
  return shapes


def _checked_optimizer_state(tensors: dict, shapes: dict, damaged) -> dict | None:
  """AdamW's state dict from the optim.* tensors (m.i and v.i for the i-th parameter), or None when there are none."""
  held = [k for k in tensors if k.startswith("optim.")]
  if not held: return None
  want = {**{f"optim.m.{n}": s for n, s in shapes.items()}, **{f"optim.v.{n}": s for n, s in shapes.items()},
          "optim.s1": (), "optim.s2": (), "optim.lr": ()}
  if missing := [k for k in want if k not in tensors]:
    raise damaged(f"its optimizer state is partial: {len(missing)} of its {len(want)} tensors are missing, {missing[:3]} first "
                  "(a checkpoint has all of them, or none to resume with a fresh optimizer)")
  if extra := [k for k in held if k not in want]: raise damaged(f"tensors {extra[:4]} are not the optimizer's")
  values = {k: _check_tensor(k, tensors[k], shape, damaged) for k, shape in want.items()}
  for k in ("optim.s1", "optim.s2"):
    if not 0 <= values[k] < 1: raise damaged(f"{k} is {float(values[k])}, outside [0, 1) where 1 - beta**step lies")
  if negative := [n for n in shapes if (values[f"optim.v.{n}"] < 0).any()]:
    raise damaged(f"optim.v.{negative[0]} has negative entries, and it is a running mean of squares")
  return {**{f"m.{i}": tensors[f"optim.m.{n}"] for i, n in enumerate(shapes)}, **{f"v.{i}": tensors[f"optim.v.{n}"] for i, n in enumerate(shapes)},
          "_s1": tensors["optim.s1"], "_s2": tensors["optim.s2"]}


# ---- the `uopc gpt` command ----------------------------------------------------------------------------------------

def _whole(name: str, low: int = 1):
  def parse(v: str) -> int:
    try: n = int(v)
    except ValueError: raise argparse.ArgumentTypeError(f"{name} takes a whole number, got {v!r}") from None
    if n < low: raise argparse.ArgumentTypeError(f"{name} must be at least {low}, got {n}")
    return n
  return parse


def learning_rate(peak: float, step: int, total: int) -> float:
  """The schedule: a linear warmup over the first 5% of the steps (at most 100), then a cosine decay to a tenth."""
  warm = max(1, min(100, total // 20))
  if step < warm: return peak * (step + 1) / warm
  t = (step - warm) / max(1, total - warm)
  return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


def _number(name: str, low: float, inclusive: bool):
  def parse(v: str) -> float:
    try: x = float(v)
    except ValueError: raise argparse.ArgumentTypeError(f"{name} takes a number, got {v!r}") from None
    if not math.isfinite(x) or x < low or (x == low and not inclusive):
      raise argparse.ArgumentTypeError(f"{name} must be {'at least' if inclusive else 'above'} {low:g}, got {v}")
    return x
  return parse


def cmd_train(args) -> int:
  if args.device: os.environ["UOPC_DEVICE"] = args.device
  Tensor.manual_seed(args.seed)
  history: list = []
  shape = {k: getattr(args, k) for k in ("layers", "width", "heads", "context")}
  if args.data and args.digits is not None: raise TensorError(f"--digits {args.digits} is for the addition task, not for --data {args.data}")
  if args.resume:
    src = Path(args.resume) / "model.safetensors"
    ckpt = load(src)
    model, spec = ckpt.model, ckpt.task
    for k, v in shape.items():
      if v is not None and v != getattr(model.cfg, k):
        raise TensorError(f"--resume {args.resume}: the checkpoint has {k} {getattr(model.cfg, k)}, but --{k} {v} was given")
    for k in ("digits", "data"):      # a resumed run keeps its task: a different one asked for is an error, not ignored
      if (v := getattr(args, k)) is not None and v != spec.get(k):
        learns = f"additions of {spec['digits']}-digit numbers" if spec["task"] == "addition" else f"the text {spec['data']}"
        raise TensorError(f"--resume {args.resume}: the checkpoint learns {learns}, but --{k} {v} was given")
    if spec["task"] == "addition": task = AdditionTask(spec["digits"], spec["seed"])
    else:
      try: task = TextTask(spec["data"], model.cfg.context, spec["seed"], spec["vocab"])
      except TensorError as e: raise CheckpointError(f"{src}: its training text can't be read again ({e})") from None
    if model.cfg.context < task.length - 1:
      raise CheckpointError(f"{src}: its context {model.cfg.context} is shorter than an example of its task ({task.length - 1} tokens)")
    start, history = ckpt.step, ckpt.history
  else:
    if args.data: task = TextTask(args.data, shape["context"] or 64, args.seed)
    else: task = AdditionTask(2 if args.digits is None else args.digits, args.seed)
    context = shape["context"] or (max(16, task.length - 1) if isinstance(task, AdditionTask) else 64)
    if context < task.length - 1: raise TensorError(f"--context {context} is shorter than an example ({task.length - 1} tokens)")
    model = GPT(GPTConfig(vocab=len(task.vocab), context=context, layers=shape["layers"] or 2, width=shape["width"] or 128,
                          heads=shape["heads"] or 4))
    start = 0
  peak = args.lr if args.lr is not None else ckpt.lr if args.resume else 3e-3
  opt = nn.AdamW(model.parameters(), lr=peak, weight_decay=0.01)
  rng = data_rng(args.seed, TRAIN_STREAM, start)        # a resumed run draws new batches, not the first run's again
  if args.resume and ckpt.optimizer is None:
    print(f"uopc: warning: {src} has no optimizer state: AdamW starts afresh (zero moments, bias correction from step 1)", file=sys.stderr)
  elif args.resume: nn.load_state_dict(opt, ckpt.optimizer, strict=False)
  out = Path(args.out or args.resume or "gpt-run")
  out.mkdir(parents=True, exist_ok=True)

  train_step = training_step(model, opt)

  # evaluation: the loss on a fixed held-out batch (both tasks), and for addition the exact-answer accuracy
  vx, vy = task.batch(data_rng(args.seed, VAL_STREAM), args.batch, "val")
  val_step = jit(lambda x, y: model.loss(x, y, training=False))
  addition = isinstance(task, AdditionTask)
  def evaluate(final: bool = False) -> tuple[float, float | None]:
    val = float(val_step(Tensor(vx), Tensor(vy)).item())
    return val, (task.accuracy(model, limit=None if final else 500) if addition else None)
  every = max(1, args.steps // 10)
  try: from tqdm import tqdm
  except ImportError: tqdm = None
  bar = tqdm(total=args.steps, desc="uopc gpt train", unit="step", file=sys.stderr, dynamic_ncols=True) if tqdm else None
  tokens_per_step = args.batch * (task.length - 1)          # positions the model reads per step
  total = start + args.steps
  t0, loss_value, val, acc = time.perf_counter(), float("nan"), None, None
  for step in range(start, total):
    opt.lr = learning_rate(peak, step, total)
    x, y = task.batch(rng, args.batch)
    if (y == -100).all():     # its loss is 0/0: a NaN that says nothing about the run, and a step that would spoil the weights
      if bar is not None: bar.close()
      raise TensorError(f"the training batch of step {step + 1} has no token to predict ({type(task).__name__} drew {len(y)} examples "
                        "with every target ignored): nothing to train on")
    loss_value = float(train_step(Tensor(x), Tensor(y)).item())
    if not math.isfinite(loss_value):
      if bar is not None: bar.close()
      raise TensorError(f"the training loss became {loss_value} at step {step + 1}: the run diverged (try a smaller --lr than {peak:g})")
    entry = [step + 1, loss_value, None, None]
    if (step + 1 - start) % every == 0 and step + 1 < total: val, acc = entry[2], entry[3] = evaluate()
    history.append(entry)
    rate = (step + 1 - start) * tokens_per_step / max(time.perf_counter() - t0, 1e-9)
    post = {"loss": f"{loss_value:.4f}"}
    if val is not None: post["val"] = f"{val:.4f}"
    if acc is not None: post["acc"] = f"{acc:.1%}"
    post["tok/s"] = f"{rate:,.0f}"
    if bar is not None:
      bar.update(1)
      bar.set_postfix(post, refresh=False)
    elif (step + 1 - start) % every == 0: print(f"step {step + 1}: " + ", ".join(f"{k} {v}" for k, v in post.items()), file=sys.stderr)
  if bar is not None: bar.close()
  val, acc = evaluate(final=True)
  if history: history[-1][2:] = [val, acc]
  save(out / "model.safetensors", model, opt, task, total, history, peak)
  plot = _plot(history, out / "loss.png", addition)
  print(f"saved {out / 'model.safetensors'}" + (f" and the plot {plot}" if plot else " (no plot: matplotlib is not installed)"))
  what = f"validation loss {val:.4f}"
  if addition: what += f", accuracy {acc:.1%} on {len(task.heldout)} held-out additions of numbers below {10 ** task.digits}"
  print(f"final loss {loss_value:.4f}, {what}")
  return 0


def _plot(history: list, path: Path, accuracy: bool) -> Path | None:
  """Training loss by step, validation loss at each evaluation, and (for addition) accuracy on a second axis."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError: return None
  fig, ax = plt.subplots(figsize=(7, 4))
  ax.plot([h[0] for h in history], [h[1] for h in history], label="training loss", lw=0.8)
  vals = [(h[0], h[2]) for h in history if h[2] is not None]
  if vals: ax.plot(*zip(*vals), "o-", color="tab:orange", label="validation loss")
  ax.set_xlabel("step")
  ax.set_ylabel("loss (cross-entropy per predicted token)")
  ax.set_yscale("log")
  lines = ax.get_legend_handles_labels()
  accs = [(h[0], h[3]) for h in history if h[3] is not None]
  if accuracy and accs:
    ax2 = ax.twinx()
    ax2.plot(*zip(*accs), "s-", color="tab:green", label="held-out accuracy")
    ax2.set_ylabel("exact-answer accuracy")
    ax2.set_ylim(0, 1.02)
    more = ax2.get_legend_handles_labels()
    lines = (lines[0] + more[0], lines[1] + more[1])
  ax.legend(*lines, loc="center right")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def cmd_sample(args) -> int:
  if args.device: os.environ["UOPC_DEVICE"] = args.device
  ckpt = load(Path(args.dir) / "model.safetensors")
  model, spec = ckpt.model, ckpt.task
  vocab = spec["vocab"]
  prompt = args.prompt
  if missing := sorted(set(prompt) - set(vocab)):
    raise TensorError(f"--prompt has characters the model never saw: {''.join(missing)!r} (its vocabulary: {vocab!r})")
  if not prompt: raise TensorError("--prompt is empty: give the model something to continue")
  ids = np.array([[vocab.index(c) for c in prompt]], np.int32)
  out = generate(model, ids, args.tokens, temperature=args.temperature, top_k=args.top_k, rng=np.random.default_rng(args.seed))[0]
  text = "".join(vocab[i] for i in out)
  if spec["task"] == "addition" and "\n" in text: text = text[:text.index("\n")]   # an answer ends with its line
  print(prompt + text)
  return 0


def register(subparsers) -> None:
  """The `uopc gpt` subcommands (the uopc.commands entry point of uopc-tensor)."""
  g = subparsers.add_parser("gpt", help="train a GPT on additions or a text file, and sample from it")
  sub = g.add_subparsers(dest="gpt_command", metavar="train|sample")
  t = sub.add_parser("train", help="train a GPT (addition by default, or --data FILE)")
  t.add_argument("--task", choices=["addition"], default="addition", help="the built-in task (default: addition)")
  t.add_argument("--data", metavar="FILE", help="train on this UTF-8 text file, character by character, instead")
  t.add_argument("--digits", type=_whole("--digits"), help="digits of each operand for addition (default 2)")
  t.add_argument("--steps", type=_whole("--steps"), default=3000, help="training steps (default 3000)")
  t.add_argument("--batch", type=_whole("--batch"), default=64, help="examples per step (default 64)")
  t.add_argument("--context", type=_whole("--context"), help="tokens the model sees (default 16 for addition, 64 for text)")
  t.add_argument("--layers", type=_whole("--layers"), help="transformer blocks (default 2)")
  t.add_argument("--width", type=_whole("--width"), help="embedding width (default 128)")
  t.add_argument("--heads", type=_whole("--heads"), help="attention heads (default 4; must divide --width)")
  t.add_argument("--lr", type=_number("--lr", 0, False), help="peak AdamW learning rate (default 3e-3; warmup, then cosine decay)")
  t.add_argument("--seed", type=_whole("--seed", 0), default=0, help="seed of the data and the initial weights (default 0)")
  t.add_argument("--device", help="backend (default: $UOPC_DEVICE, or C)")
  t.add_argument("--out", metavar="DIR", help="where model.safetensors and loss.png go (default: gpt-run, or the --resume DIR)")
  t.add_argument("--resume", metavar="DIR", help="continue training the checkpoint in DIR (a fresh AdamW, with a warning, if it has none)")
  t.set_defaults(func=cmd_train)
  s = sub.add_parser("sample", help="continue a prompt with a trained GPT")
  s.add_argument("dir", metavar="DIR", help="the directory `uopc gpt train --out` wrote")
  s.add_argument("--prompt", default="\n", help='the text to continue (for addition: "12+34=")')
  s.add_argument("--tokens", type=_whole("--tokens"), default=32, help="tokens to generate (default 32; past the context, a sliding window)")
  s.add_argument("--temperature", type=_number("--temperature", 0, True), default=0.0, help="0 is greedy (the default); higher is more random")
  s.add_argument("--top-k", type=_whole("--top-k"), help="sample among the k likeliest tokens only")
  s.add_argument("--seed", type=_whole("--seed", 0), default=0, help="seed of the sampling (default 0)")
  s.add_argument("--device", help="backend (default: $UOPC_DEVICE, or C)")
  s.set_defaults(func=cmd_sample)
  g.set_defaults(func=lambda args: g.print_help() or 2)


__all__ = ["GPTConfig", "GPT", "Block", "parameter_shapes", "parameter_count", "data_rng", "AdditionTask", "TextTask", "generate",
           "CheckpointError", "Checkpoint", "save", "load", "register"]
