"""uopc.nn.optim: the optimizers (SGD, Adam, AdamW), each a rule from a parameter and its gradient to its next value.

An optimizer holds a list of parameters; `step()` computes every update lazily and realizes them in one schedule, so
the kernels of all parameters (and the forward work they share) run together, and `zero_grad()` clears the grads.
Everything that changes from step to step is a Tensor updated with assign (see Optimizer), so a step is the same graph
every time: it compiles once, and uopc.jit can capture a whole training step and replay it.
"""
from __future__ import annotations
import math, warnings
import numpy as np
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops
from uopc.tensor import Tensor, TensorError
from uopc.tensor.core import differentiated


def hyperparameter(name: str, v, low: float = 0.0, high: float = math.inf) -> float:
  """A hyperparameter: a number in [low, high) (torch refuses a negative learning rate, a beta of 1, ...)."""
  if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not low <= v < high:
    raise TensorError(f"{name} must be a number in [{low}, {high}), got {v!r}")
  return float(v)


class Optimizer:
  """The parameters and the state of an optimizer are Tensors updated with assign: every step is the same graph over the
  same tensors, so it compiles once, and uopc.jit can capture a whole training step and replay it. Scalars that change
  from step to step (the learning rate, Adam's bias corrections) are state tensors too, never python constants baked
  into a kernel (a new constant is a new kernel structure: a compile every step, and a frozen value in a replay)."""
  def __init__(self, params: list[Tensor], lr: float):
    if isinstance(params, Tensor) or not hasattr(params, "__iter__"):
      raise TensorError(f"an optimizer takes a list of parameters (Tensors), got {type(params).__name__}")
    hyperparameter("lr", lr)
    self.params = list(params)
    if not self.params: raise TensorError("an optimizer needs at least one parameter")
    for p in self.params:
      if not isinstance(p, Tensor): raise TensorError(f"optimizer parameters must be Tensors, got {type(p).__name__}")
      if not p.requires_grad: p.requires_grad_(True)
    if len({id(p) for p in self.params}) != len(self.params):   # each copy would be stepped: twice the update (torch warns too)
      warnings.warn("optimizer: a parameter is given more than once, so each step updates it once per copy", UserWarning, stacklevel=3)
    self._lr = self._scalar(lr)

  @property
  def lr(self) -> float: return float(self._lr.item())
  @lr.setter
  def lr(self, value: float) -> None: self._lr._write(np.full(self._lr.shape, hyperparameter("lr", value), np.float32))   # in place: a jit sees it

  def zero_grad(self) -> None:
    for p in self.params: p.grad = None

  def step(self) -> None:
    """Apply one update to every parameter with a gradient, all realized in one schedule with the gradients themselves
    and the loss backward() was called on (when it is not computed yet): each shares the schedule's forward and backward
    passes instead of repeating them when it is read later (uopc.jit realizes every .grad a step set, and a training
    loop prints its loss: a jitted GPT step computed 5.8 GFLOP for 2.9 of work)."""
    if ts := self.update():
      grads = [p.grad for p in self.params if p.grad is not None]
      ts[0].realize(*ts[1:], *grads, *differentiated())

  def update(self) -> list[Tensor]:
    """Give every parameter with a gradient its updated value, lazily (nothing runs), and return the tensors a step
    realizes: the parameters and the optimizer's state. step() is update() and one realize."""
    todo = [(i, p) for i, p in enumerate(self.params) if p.grad is not None]
    if not todo: return []
    state = self._step_state()
    for i, p in todo:
      value, own = self._update(i, p, p.grad._stop_gradient())
      p.assign(value.cast(p.dtype))
      state += own
    return [p for _, p in todo] + state

  def _step_state(self) -> list[Tensor]: return []
  def _update(self, i: int, p: Tensor, g: Tensor) -> tuple[Tensor, list[Tensor]]:
    raise NotImplementedError

  def _scalar(self, v: float) -> Tensor: return Tensor(np.array(v, dtype=np.float32), device=self.params[0].device)
  def _zeros(self) -> list[Tensor]:
    """A realized f32 tensor of zeros per parameter, filled from NumPy: realizing Tensor.zeros would compile a fill
    kernel per shape and schedule each alone (AdamW's moments took 0.4 s of a GPT's setup with a cold compile cache)."""
    return [Tensor(np.zeros(p.shape, np.float32), device=p.device) for p in self.params]


class SGD(Optimizer):
  """p -= lr * v, with v = momentum * v + (g + weight_decay * p) (torch's SGD, nesterov optional)."""
  def __init__(self, params: list[Tensor], lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False):
    super().__init__(params, lr)
    self.momentum, self.weight_decay = hyperparameter("momentum", momentum), hyperparameter("weight_decay", weight_decay)
    self.nesterov = nesterov
    self.buf = self._zeros() if momentum else []          # torch's first step sets v = g, which is 0 * momentum + g

  def _update(self, i, p, g):
    if self.weight_decay: g = g + self.weight_decay * p._stop_gradient()
    state = []
    if self.momentum:
      v = self.buf[i].assign(self.buf[i] * self.momentum + g)
      state.append(v)
      g = g + self.momentum * v if self.nesterov else v
    return p._stop_gradient() - self._lr * g, state


class Adam(Optimizer):
  """Adam (weight_decay adds weight_decay * p to the gradient, as torch's Adam); AdamW decays the weights directly.
  The bias corrections come from state kept as 1 - b**t, updated as s*b + (1 - b): no cancellation in 1 - 0.999**t for
  small t, as computing b**t in f32 would give. As torch's, a step is p -= (lr / (1 - b1**t)) * m / (sqrt(v) /
  sqrt(1 - b2**t) + eps), with the step size, 1 / sqrt(1 - b2**t) and the decay computed once a step and broadcast
  once a shape: a GPT has 29 parameters of 9 shapes, and the step's graph is built in Python every plain step."""
  decoupled = False

  def __init__(self, params: list[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.0):
    super().__init__(params, lr)
    if not isinstance(betas, (tuple, list)) or len(betas) != 2: raise TensorError(f"betas must be a pair of numbers, got {betas!r}")
    self.b1, self.b2 = hyperparameter("betas[0]", betas[0], 0.0, 1.0), hyperparameter("betas[1]", betas[1], 0.0, 1.0)
    self.eps, self.weight_decay = hyperparameter("eps", eps), hyperparameter("weight_decay", weight_decay)
    self.t = 0
    self.m, self.v = self._zeros(), self._zeros()
    self._s1, self._s2 = self._scalar(0.0), self._scalar(0.0)       # 1 - b1**t and 1 - b2**t
    self._constants: dict[tuple, tuple[Tensor, ...]] = {}            # (shape, device) -> b1, 1 - b1, b2, 1 - b2, eps
    # during update() only: the step size, 1 / sqrt(1 - b2**t) and the decay, and (shape, device) -> all of them broadcast
    self._scalars: tuple = ()
    self._per_step: dict[tuple, tuple[Tensor, ...]] = {}

  def _step_state(self) -> list[Tensor]:
    self.t += 1
    s1 = self._s1.assign(self._s1 * self.b1 + (1 - self.b1))
    s2 = self._s2.assign(self._s2 * self.b2 + (1 - self.b2))
    decay = 1 - self._lr * self.weight_decay if self.decoupled and self.weight_decay else None
    self._scalars = (-self._lr / s1, s2.sqrt().recip(), decay)
    return [s1, s2]

  def update(self) -> list[Tensor]:
    try: return super().update()
    finally: self._per_step, self._scalars = {}, ()   # this step's graphs are not kept past it

  def _shaped(self, p: Tensor) -> tuple[Tensor, ...]:
    """This step's scalars and the constants, each broadcast to p's shape (once a shape: a hit costs a dict probe, and
    the ops between tensors of one shape and dtype take the shortest road)."""
    key = (p.shape, p.device)
    if (per := self._per_step.get(key)) is None:
      if (const := self._constants.get(key)) is None:
        const = self._constants[key] = tuple(Tensor.full(p.shape, v, device=p.device)
                                             for v in (self.b1, 1 - self.b1, self.b2, 1 - self.b2, self.eps))
      per = self._per_step[key] = const + tuple(s._broadcast_to(p.shape) if s is not None else None for s in self._scalars)
    return per

  def _update(self, i, p, g):
    b1, c1, b2, c2, eps, step, rc2, decay = self._shaped(p)
    if p.dtype is g.dtype is self.m[i].dtype is self.v[i].dtype is dtypes.f32 and p.device == g.device == self.m[i].device:
      return self._update_f32(i, p, g, (b1, c1, b2, c2, eps, step, rc2, decay))
    return self._update_tensors(i, p, g, (b1, c1, b2, c2, eps, step, rc2, decay))

  def _update_tensors(self, i, p, g, shaped):
    b1, c1, b2, c2, eps, step, rc2, decay = shaped
    w = p._stop_gradient()
    if self.weight_decay and not self.decoupled: g = g + w * self.weight_decay
    if decay is not None: w = w * decay
    m = self.m[i].assign(self.m[i] * b1 + g * c1)
    v = self.v[i].assign(self.v[i] * b2 + g * g * c2)
    return w + step * m / (v.sqrt() * rc2 + eps), [m, v]

  def _update_f32(self, i, p, g, shaped):
    """_update's graph for f32 tensors, node for node (a test holds them to it), built from UOps: operands of one shape
    and dtype need none of the Tensor ops' promotion and broadcasting, which were most of a GPT step's 1.1 ms of updates."""
    b1, c1, b2, c2, eps, step, rc2, decay = (t.uop if t is not None else None for t in shaped)
    ADD, MUL = Ops.ADD, Ops.MUL
    w = UOp(Ops.CAST, (p.uop,), dtypes.f32)                  # p._stop_gradient()
    gu = g.uop
    if self.weight_decay and not self.decoupled: gu = UOp(ADD, (gu, w * self.weight_decay))
    if decay is not None: w = UOp(MUL, (w, decay))
    m = self.m[i].assign(self.m[i]._new(UOp(ADD, (UOp(MUL, (self.m[i].uop, b1)), UOp(MUL, (gu, c1))))))
    v = self.v[i].assign(self.v[i]._new(UOp(ADD, (UOp(MUL, (self.v[i].uop, b2)), UOp(MUL, (UOp(MUL, (gu, gu)), c2))))))
    denominator = UOp(ADD, (UOp(MUL, (UOp(Ops.SQRT, (v.uop,)), rc2)), eps))
    return p._new(UOp(ADD, (w, UOp(MUL, (UOp(MUL, (step, m.uop)), UOp(Ops.RECIP, (denominator,))))))), [m, v]


class AdamW(Adam):
  """Adam with decoupled weight decay: p *= 1 - lr * weight_decay before the Adam step (torch's AdamW, default 0.01)."""
  decoupled = True

  def __init__(self, params: list[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.01):
    super().__init__(params, lr, betas, eps, weight_decay)   # (checked by Adam)
