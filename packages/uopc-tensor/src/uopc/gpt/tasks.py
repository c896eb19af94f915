"""uopc.gpt.tasks: what the GPT learns, as batches of (input tokens, target tokens), and the run's random streams.

AdditionTask writes additions as text ("7+45=52\\n") and predicts only the answers; its accuracy is exact-answer greedy
decoding of held-out problems. TextTask reads any UTF-8 file character by character. Both draw batches from a
generator the caller passes, one stream per purpose (data_rng), so a run is reproducible from its seed.
"""
from __future__ import annotations
from pathlib import Path
import numpy as np
from uopc.tensor import TensorError
from uopc.gpt.model import GPT, generate


# A run's random streams, one per purpose, all from its seed. numpy pads short entropy with zeros, so default_rng([seed, 0])
# *is* default_rng(seed): training batches drawn from default_rng([seed, step]) repeated, at step 0, AdditionTask's
# held-out draw; for 3 digits and more every problem was skipped, and the empty batch's loss (0/0) read as a diverged
# run. A SeedSequence spawn key keeps each stream apart from the held-out one and from the others.
TRAIN_STREAM, VAL_STREAM = 1, 2


def data_rng(seed: int, stream: int, *more: int) -> np.random.Generator:
  """The generator of one stream of a run (TRAIN_STREAM and the step a run starts at, or VAL_STREAM) for `seed`."""
  return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream, *more)))


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
