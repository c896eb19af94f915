"""Differential fuzzer for uopc.jit: random training loops, run in two worlds from the same state, one calling the step
through jit and one calling it plainly; after every event all state and every output ever returned are compared.

A loop is drawn from the shapes users write: a small MLP trained by SGD, momentum, Adam or a hand-written assign update,
with the backward and the update inside the step or outside it (gradient accumulation), dropout, a moving average kept
by assign, and tensor arguments passed plainly, in a list or a dict, sometimes the same tensor twice or two equal
constants. Between calls come the events that a replay can't see from inside: assigns to the parameters outside (left
lazy or realized), load_state_dict, a learning-rate change, a plain call of the same step, an optimizer step and
zero_grad outside, a mutable argument changed in place (the jitted call must refuse it while it differs, with JitError).

A failure prints the loop and its events; UOPC_JIT_FUZZ_SEED=N replays one. UOPC_FUZZ_ITERS=N draws N loops (CI: 24, the
same every run).
"""
import os
import numpy as np
import pytest
from uopc.tensor import Tensor
from uopc.jit import jit, JitError
from uopc import nn

ITERS = int(os.environ.get("UOPC_FUZZ_ITERS", "24"))
RANDOM = bool(os.environ.get("UOPC_FUZZ_ITERS"))   # the long mode draws its loops at random; CI replays loops 0..23
EVENTS = ["plain", "assign", "assign_lazy", "load", "lr", "opt_outside", "zero_grad", "mutate"]


def draw_loop(rng: np.random.Generator) -> dict:
  """A loop: the model, the step's shape, and its events (the first two calls run and capture it; each later one is a
  replay, or a new capture where the arguments' aliasing or the .grad being None changed; at least four calls). Two widths and two batch
  sizes only: loops share their kernels, so a CI run compiles little."""
  optim = str(rng.choice(["sgd", "momentum", "adam", "manual", "none"]))
  inside = str(rng.choice(["step", "backward", "backward", "forward"])) if optim != "none" else "forward"
  events = ["call"] + [str(e) if rng.random() < 0.55 else "call" for e in rng.choice(EVENTS, size=int(rng.integers(9, 15)))]
  events += ["call"] * max(0, 4 - events.count("call"))
  return {
    "width": int(rng.choice([2, 3])), "hidden": 4, "batch": int(rng.choice([1, 3])),
    "optim": optim, "inside": inside, "zero_grad_inside": bool(rng.random() < 0.4), "dropout": bool(rng.random() < 0.3),
    "ema": bool(rng.random() < 0.4), "pack": str(rng.choice(["plain", "list", "dict"])), "scale_arg": str(rng.choice(["none", "list", "array"])),
    "returns": sorted(set(rng.choice(["loss", "pred", "ema", "x", "aux"], size=int(rng.integers(1, 4))).tolist())),
    "events": events, "aliasing": [str(a) for a in rng.choice(["distinct", "distinct", "same", "zeros"], size=len(events))],
  }


class World:
  """One copy of the loop's state and its step function."""
  def __init__(self, loop: dict, jitted: bool):
    self.loop = loop
    Tensor.manual_seed(1234)
    w, h = loop["width"], loop["hidden"]
    self.l1, self.l2 = nn.Linear(w, h), nn.Linear(h, 2)
    self.params = [self.l1.weight, self.l1.bias, self.l2.weight, self.l2.bias]
    self.lr = 0.1
    opt = loop["optim"]
    self.opt = nn.SGD(self.params, lr=0.1) if opt == "sgd" else nn.SGD(self.params, lr=0.1, momentum=0.9) if opt == "momentum" \
      else nn.Adam(self.params, lr=0.05) if opt == "adam" else None
    if opt == "manual":
      for p in self.params: p.requires_grad_()
    if opt == "none":
      for p in self.params: p.requires_grad_(False)
    self.ema = Tensor.zeros(1).realize()
    self.scale = [1.0, 0.5] if loop["scale_arg"] == "list" else np.array([1.0, 0.5], np.float32)
    self.kept: list = []
    self.step = jit(self.plain) if jitted else self.plain

  def state(self) -> dict:
    s = {f"p{i}": p for i, p in enumerate(self.params)} | {f"g{i}": p.grad for i, p in enumerate(self.params)} | {"ema": self.ema}
    if self.opt is not None: s |= {f"opt.{k}": v for k, v in nn.get_state_dict(self.opt).items()}
    return s

  def zero_grad(self):
    for p in self.params: p.grad = None

  def plain(self, *args, **kwargs):
    loop = self.loop
    if loop["pack"] == "list": (x, aux, y), rest = args[0], args[1:]
    elif loop["pack"] == "dict": (x, aux, y), rest = (args[0][k] for k in ("x", "aux", "y")), args[1:]
    else: x, aux, y, rest = args[0], args[1], args[2], args[3:]
    scale = float(rest[0][0]) if rest else 1.0
    if loop["inside"] != "forward" and loop["zero_grad_inside"]: self.zero_grad()
    hidden = self.l1(x * scale + aux).relu()
    if loop["dropout"]: hidden = hidden.dropout(0.3)
    pred = self.l2(hidden)
    loss = (pred - y).square().mean()
    if loop["inside"] in ("step", "backward"): loss.backward()
    if loop["inside"] == "step": self.update()
    if loop["ema"]: self.ema.assign(self.ema * 0.9 + loss.reshape(1) * 0.1)
    found = {"loss": loss, "pred": pred, "ema": self.ema, "x": x, "aux": aux}
    return tuple(found[k] for k in loop["returns"])

  def update(self):
    if self.opt is not None: return self.opt.step()
    for p in self.params:
      if p.grad is not None: p.assign(p._stop_gradient() - self.lr * p.grad._stop_gradient())
    Tensor.realize(*[p for p in self.params])

  def arguments(self, k: int, aliasing: str):
    loop, rng = self.loop, np.random.default_rng(k)
    x = Tensor(rng.standard_normal((loop["batch"], loop["width"])).astype(np.float32))
    aux = x if aliasing == "same" else Tensor.zeros(loop["batch"], loop["width"]) if aliasing == "zeros" else \
      Tensor(rng.standard_normal((loop["batch"], loop["width"])).astype(np.float32))
    if aliasing == "zeros": x = Tensor.zeros(loop["batch"], loop["width"])        # two equal constants: one graph
    y = Tensor(rng.standard_normal((loop["batch"], 2)).astype(np.float32))
    packed = [[x, aux, y]] if loop["pack"] == "list" else [{"x": x, "aux": aux, "y": y}] if loop["pack"] == "dict" else [x, aux, y]
    return packed + ([self.scale] if loop["scale_arg"] != "none" else [])


def close(a, b, what: str):
  if a is None or b is None:
    assert a is None and b is None, f"{what}: {a} against {b}"
    return
  np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-4, atol=2e-5, err_msg=what)


def run_loop(seed: int) -> None:
  loop = draw_loop(np.random.default_rng(seed))
  fast, slow = World(loop, True), World(loop, False)
  jit_calls, captured_scale = 0, None
  for n, event in enumerate(loop["events"]):
    if event in ("call", "plain"):
      Tensor.manual_seed(n)
      args_f = fast.arguments(n, loop["aliasing"][n])
      # a changed mutable argument is refused once captured (a replay can't see it): the slow world skips the call too
      refuse = event == "call" and jit_calls >= 2 and loop["scale_arg"] != "none" and fast.scale[0] != captured_scale
      try: out_f = (fast.step if event == "call" else fast.plain)(*args_f)
      except JitError as e:
        assert refuse and "other arguments differ" in str(e), f"refused: {e}"
        continue
      assert not refuse, "a call with a changed argument was replayed"
      if event == "call":
        jit_calls += 1
        if jit_calls == 2: captured_scale = fast.scale[0]
      Tensor.manual_seed(n)
      out_s = slow.plain(*slow.arguments(n, loop["aliasing"][n]))
      fast.kept.append(out_f), slow.kept.append(out_s)
    elif event in ("assign", "assign_lazy"):
      for w in (fast, slow):
        p = w.params[n % 4]
        p.assign(p._stop_gradient() * 0.5 + 0.1)
        if event == "assign": p.realize()
    elif event == "load":
      values = {name: np.full(t.shape, 0.01 * (i + 1), np.float32) for i, (name, t) in enumerate(nn.get_state_dict(fast.l1).items())}
      for w in (fast, slow): nn.load_state_dict(w.l1, values)
    elif event == "lr":
      for w in (fast, slow):
        if w.opt is not None: w.opt.lr = 0.02 * (n + 1)
    elif event == "opt_outside":
      if loop["inside"] == "backward":
        for w in (fast, slow): w.update(), w.zero_grad()
    elif event == "zero_grad":
      for w in (fast, slow): w.zero_grad()
    elif event == "mutate" and loop["scale_arg"] != "none":
      for w in (fast, slow): w.scale[0] = 3.0 - w.scale[0]   # in place: 1.0 <-> 2.0
    for name, a in fast.state().items(): close(a, slow.state()[name], f"after event {n} ({event}): {name}")
  for i, (a, b) in enumerate(zip(fast.kept, slow.kept)):   # every output keeps the value it had when returned
    for j, (u, v) in enumerate(zip(a, b)): close(u, v, f"output {j} of call {i}")


@pytest.mark.parametrize("k", range(1) if os.environ.get("UOPC_JIT_FUZZ_SEED") else range(ITERS))
def test_jit_replays_match_plain_calls_in_random_training_loops(k):
  seed = int(os.environ.get("UOPC_JIT_FUZZ_SEED") or (np.random.default_rng().integers(2**31) if RANDOM else k))
  try: run_loop(seed)
  except Exception as e:
    loop = draw_loop(np.random.default_rng(seed))
    raise AssertionError(f"UOPC_JIT_FUZZ_SEED={seed}: loop {loop}\n{type(e).__name__}: {e}") from e
