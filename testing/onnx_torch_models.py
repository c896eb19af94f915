"""Small PyTorch models exported with torch.onnx.export, for uopc.onnx's model tests (packages/uopc-tensor/tests_onnx/
test_models_torch.py) and benchmarks/onnx.py: an MLP, a small ResNet, a small GPT-2-style decoder and a 2-layer LSTM,
each with seeded weights and an input. Needs torch (2.13.0 in the sessions that install it)."""
from __future__ import annotations
import io
import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

OPSET = 17


class MLP(nn.Module):
  def __init__(self):
    super().__init__()
    self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))
  def forward(self, x): return self.net(x).log_softmax(-1)


class Block(nn.Module):
  def __init__(self, cin: int, cout: int, stride: int):
    super().__init__()
    self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
    self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
    self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)) if stride != 1 or cin != cout else None
  def forward(self, x):
    y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
    return F.relu(y + (self.down(x) if self.down is not None else x))


class ResNet(nn.Module):
  """A ResNet-10-like network for 32x32 images: a stem, four basic blocks (two downsampling), global pooling, a classifier."""
  def __init__(self):
    super().__init__()
    self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
    self.blocks = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 32, 1), Block(32, 64, 2))
    self.fc = nn.Linear(64, 10)
  def forward(self, x): return self.fc(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1))


class Decoder(nn.Module):
  """GPT-2's shape, small: token and position embeddings, pre-LayerNorm blocks of causal self-attention (a masked softmax)
  and a GELU MLP, a final LayerNorm and a head tied to the token embedding."""
  def __init__(self, vocab: int = 96, context: int = 32, width: int = 64, heads: int = 4, layers: int = 2):
    super().__init__()
    self.heads = heads
    self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
    self.blocks = nn.ModuleList(nn.ModuleDict({"ln1": nn.LayerNorm(width), "qkv": nn.Linear(width, 3 * width), "proj": nn.Linear(width, width),
                                               "ln2": nn.LayerNorm(width), "fc": nn.Linear(width, 4 * width), "out": nn.Linear(4 * width, width)})
                                for _ in range(layers))
    self.ln = nn.LayerNorm(width)
    self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)))
  def forward(self, ids):
    B, T = ids.shape
    x = self.wte(ids) + self.wpe(torch.arange(T, device=ids.device))
    for b in self.blocks:
      q, k, v = b["qkv"](b["ln1"](x)).split(x.shape[-1], dim=-1)
      q, k, v = (t.reshape(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
      att = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
      att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(-1)
      x = x + b["proj"]((att @ v).transpose(1, 2).reshape(B, T, -1))
      x = x + b["out"](F.gelu(b["fc"](b["ln2"](x))))
    return self.ln(x) @ self.wte.weight.T


class LSTMNet(nn.Module):
  def __init__(self):
    super().__init__()
    self.lstm, self.head = nn.LSTM(16, 32, num_layers=2, batch_first=True), nn.Linear(32, 4)
  def forward(self, x):
    y, (h, c) = self.lstm(x)
    return self.head(y[:, -1]), h


def models(seed: int = 0) -> dict[str, tuple[bytes, dict[str, np.ndarray]]]:
  """name -> (the exported ONNX model's bytes, its inputs by name), weights and inputs drawn from `seed`."""
  torch.manual_seed(seed)
  rng = np.random.default_rng(seed)
  made = {
    "mlp": (MLP(), {"x": rng.standard_normal((8, 64)).astype(np.float32)}),
    "resnet": (ResNet(), {"x": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)}),
    "gpt2": (Decoder(), {"ids": rng.integers(0, 96, (2, 32)).astype(np.int64)}),
    "lstm": (LSTMNet(), {"x": rng.standard_normal((4, 12, 16)).astype(np.float32)}),
  }
  out = {}
  for name, (module, inputs) in made.items():
    module.eval()
    if name == "resnet":   # trained-looking statistics, so BatchNormalization does something
      for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
          m.running_mean.uniform_(-0.2, 0.2)
          m.running_var.uniform_(0.5, 1.5)
    f = io.BytesIO()
    args = tuple(torch.from_numpy(v) for v in inputs.values())
    torch.onnx.export(module, args, f, dynamo=False, opset_version=OPSET, input_names=list(inputs))
    out[name] = (f.getvalue(), inputs)
  return out
