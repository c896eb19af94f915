"""uopc.onnx.ops_seq: the ops that carry state or choose what runs: the recurrent ops (RNN, GRU, LSTM), If, Loop and
Scan, and the quantization ops.

The recurrent ops are unrolled over the sequence, which is fixed when the graph is built: the input projections of
every step are one matmul, then each step is a matmul of the hidden state and elementwise gates (uopc's kernel cache
compiles a step's kernels once for all steps). sequence_lens masks the steps past each sequence's end: the state stays,
the output is zero, as ONNX says.

If runs the branch its condition picks when the condition is a host value; otherwise both branches, joined with a
where when they agree in shape (no value is read, so a jitted call keeps its capture), or by reading the condition.
Loop and Scan run their body once per iteration; a Loop's trip count and condition are read as host values.
"""
from __future__ import annotations
import numpy as np
from uopc.dtype import dtypes
from uopc.tensor import Tensor
from uopc.onnx.registry import op
from uopc.onnx.dtypes import OnnxError, dtype_range, compute_dtype
from uopc.onnx.ops_math import true_div

MAX_LOOP = 1 << 16   # iterations a Loop may run (its trip count can be INT64_MAX, ended by its condition)


_RNN_ATTRS = ("activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "layout")


# ---- recurrent ops
def _activation(name: str, alpha: float | None, beta: float | None):
  n = name.lower()
  if n == "sigmoid": return lambda x: x.sigmoid()
  if n == "tanh": return lambda x: x.tanh()
  if n == "relu": return lambda x: x.relu()
  if n == "affine": return lambda x: x * alpha + beta
  if n == "leakyrelu": return lambda x: x.leaky_relu(alpha if alpha is not None else 0.01)
  if n == "thresholdedrelu": return lambda x: (x > (alpha if alpha is not None else 1.0)).where(x, 0.0)
  if n == "scaledtanh": return lambda x: (x * beta).tanh() * alpha
  if n == "hardsigmoid": return lambda x: (x * (alpha if alpha is not None else 0.2) + (beta if beta is not None else 0.5)).clip(0.0, 1.0)
  if n == "elu": return lambda x: x.elu(alpha if alpha is not None else 1.0)
  if n == "softsign": return lambda x: x.softsign()
  if n == "softplus": return lambda x: x.softplus()
  raise NotImplementedError(f"uopc.onnx: recurrent activation {name!r} is not supported")


_TAKES = {"affine": 2, "leakyrelu": 1, "thresholdedrelu": 1, "scaledtanh": 2, "hardsigmoid": 2, "elu": 1}


def _activations(names, alphas, betas, defaults: list[str], directions: int):
  names = list(names) if names else defaults * directions
  if len(names) == len(defaults) and directions == 2: names = names * 2
  alphas, betas = list(alphas or []), list(betas or [])
  fns = []
  for n in names:
    k = _TAKES.get(n.lower(), 0)
    a = alphas.pop(0) if k >= 1 and alphas else None
    b = betas.pop(0) if k >= 2 and betas else None
    fns.append(_activation(n, a, b))
  per = len(defaults)
  return [fns[d * per:(d + 1) * per] for d in range(directions)]


def _recurrent(ctx, kind: str, x, w, r, b, lens, h0, c0, p, attrs):
  direction, hidden = attrs.get("direction", "forward"), attrs["hidden_size"]
  layout, clip = attrs.get("layout", 0), attrs.get("clip")
  if attrs.get("input_forget", 0): raise NotImplementedError("uopc.onnx: LSTM with input_forget=1 is not supported")
  dirs = 2 if direction == "bidirectional" else 1
  gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
  defaults = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind]
  acts = _activations(attrs.get("activations"), attrs.get("activation_alpha"), attrs.get("activation_beta"), defaults, dirs)
  f32 = lambda t: t if t is None or t.dtype is dtypes.f32 else t.float()
  # W and R as initializers are stored transposed once, (dirs, in, gates H): each step's matmul reads their rows
  wt, rt = (f32(ctx.transposed_initializer(i, (0, 2, 1))) for i in (1, 2))
  x, w, r, b, h0, c0, p = map(f32, (x, w, r, b, h0, c0, p))
  if layout: x = x.transpose(0, 1)
  T, N = x.shape[:2]
  H = hidden
  if layout:
    h0 = h0.transpose(0, 1) if h0 is not None else None
    c0 = c0.transpose(0, 1) if c0 is not None else None
  ys, hs, cs = [], [], []
  for d in range(dirs):
    fa, ga, ha = (acts[d] + [None, None])[:3]
    wdt = wt[d] if wt is not None else w[d].T                 # (in, gates H)
    rdt = rt[d] if rt is not None else r[d].T                 # (H, gates H)
    bw, br = (b[d][:gates * H], b[d][gates * H:]) if b is not None else (None, None)
    xp = x.reshape(T * N, -1).matmul(wdt).reshape(T, N, gates * H)
    if bw is not None: xp = xp + bw
    h = h0[d] if h0 is not None else Tensor.zeros(N, H, device=ctx.device)
    c = c0[d] if c0 is not None else Tensor.zeros(N, H, device=ctx.device)
    out = [None] * T
    steps = range(T - 1, -1, -1) if (direction == "reverse" or d == 1) else range(T)
    for t in steps:
      g = xp[t]
      gc = lambda v: v.clip(-clip, clip) if clip is not None else v
      if kind == "RNN":
        pre = g + h.matmul(rdt) + (br if br is not None else 0.0)
        nh, nc = fa(gc(pre)), c
      elif kind == "GRU":
        hr = h.matmul(rdt)
        rb = br if br is not None else Tensor.zeros(3 * H, device=ctx.device)
        z = fa(gc(g[:, :H] + hr[:, :H] + rb[:H]))
        rr = fa(gc(g[:, H:2 * H] + hr[:, H:2 * H] + rb[H:2 * H]))
        if attrs.get("linear_before_reset", 0): hh = ga(gc(g[:, 2 * H:] + rr * (hr[:, 2 * H:] + rb[2 * H:])))
        else: hh = ga(gc(g[:, 2 * H:] + (rr * h).matmul(rdt[:, 2 * H:]) + rb[2 * H:]))
        nh, nc = (1 - z) * hh + z * h, c
      else:
        pre = g + h.matmul(rdt) + (br if br is not None else 0.0)
        pi, po, pf = (p[d][:H], p[d][H:2 * H], p[d][2 * H:]) if p is not None else (None, None, None)
        i_ = fa(gc(pre[:, :H] + (pi * c if pi is not None else 0.0)))
        f_ = fa(gc(pre[:, 2 * H:3 * H] + (pf * c if pf is not None else 0.0)))
        nc = f_ * c + i_ * ga(gc(pre[:, 3 * H:]))
        o_ = fa(gc(pre[:, H:2 * H] + (po * nc if po is not None else 0.0)))
        nh = o_ * ha(nc)
      if lens is not None:
        live = (lens > t).reshape(N, 1)
        nh, nc = live.where(nh, h), live.where(nc, c)
        out[t] = live.where(nh, 0.0)
      else: out[t] = nh
      h, c = nh, nc
    ys.append(Tensor.stack(*out, dim=0))
    hs.append(h)
    cs.append(c)
  y = Tensor.stack(*ys, dim=1)                                   # (T, dirs, N, H)
  yh, yc = Tensor.stack(*hs, dim=0), Tensor.stack(*cs, dim=0)
  if layout: y, yh, yc = y.permute(2, 0, 1, 3), yh.transpose(0, 1), yc.transpose(0, 1)
  return (y, yh, yc) if kind == "LSTM" else (y, yh)


@op("RNN", since=7, attrs=_RNN_ATTRS)
def rnn(ctx, x, w, r, b=None, sequence_lens=None, initial_h=None, **attrs):
  return _recurrent(ctx, "RNN", x, w, r, b, sequence_lens, initial_h, None, None, attrs)
@op("GRU", since=7, attrs=_RNN_ATTRS + ("linear_before_reset",))
def gru(ctx, x, w, r, b=None, sequence_lens=None, initial_h=None, **attrs):
  return _recurrent(ctx, "GRU", x, w, r, b, sequence_lens, initial_h, None, None, attrs)
@op("LSTM", since=7, attrs=_RNN_ATTRS + ("input_forget",))
def lstm(ctx, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, **attrs):
  return _recurrent(ctx, "LSTM", x, w, r, b, sequence_lens, initial_h, initial_c, p, attrs)


# ---- control flow
def _same_shapes(a: list, b: list) -> bool:
  return len(a) == len(b) and all(isinstance(x, Tensor) and isinstance(y, Tensor) and x.shape == y.shape and x.dtype is y.dtype
                                  for x, y in zip(a, b))


@op("If", since=1)
def if_(ctx, cond, then_branch, else_branch):
  known = ctx.known(0)
  if known is not None: return tuple(ctx.run_graph(then_branch if bool(np.asarray(known).reshape(-1)[0]) else else_branch, []))
  a, b = ctx.run_graph(then_branch, []), ctx.run_graph(else_branch, [])
  a = [ctx.tensor(v) if isinstance(v, np.ndarray) else v for v in a]
  b = [ctx.tensor(v) if isinstance(v, np.ndarray) else v for v in b]
  if _same_shapes(a, b): return tuple(cond.reshape(()).where(x, y) for x, y in zip(a, b))
  return tuple(a if bool(ctx.host(0).reshape(-1)[0]) else b)


@op("Loop", since=1)
def loop(ctx, trip, cond, *carried, body):
  n = int(np.asarray(ctx.host(0)).reshape(-1)[0]) if trip is not None else None
  go = bool(np.asarray(ctx.host(1)).reshape(-1)[0]) if cond is not None else True
  values, scans, i = list(carried), None, 0
  while go and (n is None or i < n):
    if i >= MAX_LOOP: raise OnnxError(f"Loop: more than {MAX_LOOP} iterations")
    outs = ctx.run_graph(body, [np.array(i, np.int64), np.array(go), *values])
    c, values, new_scans = outs[0], list(outs[1:1 + len(carried)]), outs[1 + len(carried):]
    scans = [[s] for s in new_scans] if scans is None else [acc + [s] for acc, s in zip(scans, new_scans)]
    go = bool(np.asarray(c if isinstance(c, np.ndarray) else c.numpy()).reshape(-1)[0])
    i += 1
  n_scan = len(ctx.step.node.output) - len(carried)
  stacked = []
  for k in range(n_scan):
    if scans is None: stacked.append(np.zeros((0,), np.float32)); continue
    items = scans[k]
    if all(isinstance(s, np.ndarray) for s in items): stacked.append(np.stack(items))
    else: stacked.append(Tensor.stack(*(ctx.tensor(s) for s in items), dim=0))
  return (*values, *stacked)


@op("Scan", since=9)
def scan(ctx, *inputs, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None, scan_output_axes=None,
         scan_output_directions=None):
  n_state = len(inputs) - num_scan_inputs
  states, xs = list(inputs[:n_state]), inputs[n_state:]
  in_axes = list(scan_input_axes or [0] * num_scan_inputs)
  in_dirs = list(scan_input_directions or [0] * num_scan_inputs)
  xs = [x.flip(a % x.ndim) if dr else x for x, a, dr in zip(xs, in_axes, in_dirs)]
  T = xs[0].shape[in_axes[0] % xs[0].ndim]
  scans: list[list] = []
  for t in range(T):
    items = [x[(slice(None),) * (a % x.ndim) + (t,)] for x, a in zip(xs, in_axes)]
    outs = ctx.run_graph(body, [*states, *items])
    states = list(outs[:n_state])
    for k, s in enumerate(outs[n_state:]):
      if t == 0: scans.append([])
      scans[k].append(ctx.tensor(s))
  out_axes = list(scan_output_axes or [0] * len(scans))
  out_dirs = list(scan_output_directions or [0] * len(scans))
  result = []
  for items, a, dr in zip(scans, out_axes, out_dirs):
    st = Tensor.stack(*items, dim=a % (items[0].ndim + 1))
    result.append(st.flip(a % st.ndim) if dr else st)
  return (*states, *result)


# ---- quantization
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
def _per_axis(s: Tensor, x: Tensor, axis: int, block_size: int) -> Tensor:
  """A scale or zero point (scalar, per-axis 1-D, or blocked) shaped to broadcast with x."""
  if s.ndim == 0 or s.numel() == 1: return s.reshape(())
  a = axis % x.ndim
  if block_size: return s.repeat_interleave(block_size, a).shrink(tuple((0, n) for n in x.shape))
  return s.reshape(tuple(-1 if k == a else 1 for k in range(x.ndim)))


def _saturate(v: Tensor, declared: np.dtype) -> Tensor:
  lo, hi = dtype_range(declared)
  return v.clip(float(lo), float(hi)).cast(compute_dtype(declared))


@op("QuantizeLinear", since=10)
def quantize_linear(ctx, x, scale, zero_point=None, axis=1, block_size=0, output_dtype=0, saturate=1, precision=0):
  want = ctx.out_types[0] or np.dtype(np.uint8)
  if want.kind not in "iu": raise NotImplementedError(f"uopc.onnx: QuantizeLinear to {want} is not supported")
  q = true_div(x.float(), _per_axis(scale.float(), x, axis, block_size)).round()
  if zero_point is not None: q = q + _per_axis(zero_point, x, axis, block_size).float()
  return _saturate(q, want)


@op("DequantizeLinear", since=10)
def dequantize_linear(ctx, x, scale, zero_point=None, axis=1, block_size=0, output_dtype=0):
  v = x.int() if x.dtype is not dtypes.i32 else x
  if zero_point is not None: v = v - _per_axis(zero_point, x, axis, block_size)
  return v.float() * _per_axis(scale.float(), x, axis, block_size)


@op("QLinearMatMul", since=10)
def qlinear_matmul(ctx, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
  """((a - a_zp) @ (b - b_zp)) * a_scale * b_scale / y_scale + y_zp, saturated: the integer product is exact in i32."""
  row = lambda t: t.reshape(-1, 1) if t.numel() > 1 else t.reshape(())    # per row of a
  col = lambda t: t.reshape(-1) if t.numel() > 1 else t.reshape(())       # per column of b
  acc = (a - row(a_zp)).matmul(b - col(b_zp))
  scale = row(a_scale.float()) * col(b_scale.float())
  return _saturate((acc.float() * (scale / y_scale.float().reshape(()))).round() + y_zp.float().reshape(()), ctx.out_types[0] or np.dtype(np.uint8))


@op("QLinearConv", since=10, attrs=_CONV_ATTRS)
def qlinear_conv(ctx, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, b=None, **attrs):
  from uopc.onnx.ops_nn import conv
  wz = w_zp.reshape((-1,) + (1,) * (w.ndim - 1)) if w_zp.numel() > 1 else w_zp.reshape(())
  acc = conv(ctx, (x - x_zp.reshape(())).int(), (w - wz).int(), b, **attrs)
  ws = w_scale.float().reshape((1, -1) + (1,) * (x.ndim - 2)) if w_scale.numel() > 1 else w_scale.float().reshape(())
  out = (acc.float() * (x_scale.float().reshape(()) * ws / y_scale.float().reshape(()))).round() + y_zp.float().reshape(())
  return _saturate(out, ctx.out_types[0] or np.dtype(np.uint8))
