"""nn: layers against NumPy, models that learn with each optimizer, state dicts and the safetensors format."""
import json, struct
import numpy as np
import pytest
from uopc.tensor import Tensor, TensorError
from uopc import nn


def test_linear_layer_matches_numpy_and_torch_init_range():
  Tensor.manual_seed(0)
  lin = nn.Linear(5, 3)
  assert lin.weight.shape == (3, 5) and lin.bias.shape == (3,)
  w = lin.weight.numpy()
  assert np.all(np.abs(w) <= 1 / np.sqrt(5)) and w.std() > 0.1
  x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
  np.testing.assert_allclose(lin(Tensor(x)).numpy(), x @ w.T + lin.bias.numpy(), rtol=1e-5, atol=1e-6)
  assert nn.Linear(5, 3, bias=False).bias is None


def test_embedding_layernorm_conv_dropout_layers():
  emb = nn.Embedding(10, 4)
  idx = np.array([[1, 9], [0, 1]], np.int32)
  np.testing.assert_array_equal(emb(Tensor(idx)).numpy(), emb.weight.numpy()[idx])
  ln = nn.LayerNorm(6)
  x = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
  ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(ln(Tensor(x)).numpy(), ref, rtol=1e-4, atol=1e-5)
  with pytest.raises(TensorError, match=r"LayerNorm\(6,\) applied to a tensor of shape \(3, 5\)"): ln(Tensor(x[:, :5]))
  conv = nn.Conv2d(2, 4, 3, padding=1, groups=2)
  assert conv.weight.shape == (4, 1, 3, 3) and conv(Tensor.randn(1, 2, 5, 5)).shape == (1, 4, 5, 5)
  drop = nn.Dropout(0.5)
  ones = Tensor.ones(1000)
  kept = drop(ones).numpy()
  assert set(np.unique(kept)) <= {0.0, 2.0} and 400 < (kept == 0).sum() < 600
  drop.training = False
  np.testing.assert_array_equal(drop(ones).numpy(), np.ones(1000))


def blobs(n: int = 240, seed: int = 0):
  """Three Gaussian blobs in 2-D: a task an MLP learns in a few dozen steps."""
  rng = np.random.default_rng(seed)
  centers = np.array([[2, 0], [-1, 1.7], [-1, -1.7]], np.float32)
  y = rng.integers(0, 3, n).astype(np.int32)
  return (centers[y] + 0.5 * rng.standard_normal((n, 2))).astype(np.float32), y


OPTIMIZERS = [(nn.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-4)), (nn.Adam, dict(lr=0.02)), (nn.AdamW, dict(lr=0.02))]

@pytest.mark.parametrize("opt_cls,kw", OPTIMIZERS, ids=[o.__name__ for o, _ in OPTIMIZERS])
def test_an_mlp_learns(opt_cls, kw):
  Tensor.manual_seed(1)
  X, Y = blobs()
  l1, l2 = nn.Linear(2, 16), nn.Linear(16, 3)
  opt = opt_cls([l1.weight, l1.bias, l2.weight, l2.bias], **kw)
  x, y = Tensor(X), Tensor(Y)
  losses = []
  for _ in range(40):
    opt.zero_grad()
    loss = l2(l1(x).relu()).cross_entropy(y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
  assert losses[-1] < losses[0] / 4, losses


def bars(n: int = 64, seed: int = 0):
  """8x8 images of one horizontal or one vertical bar, with noise: the class is the bar's orientation."""
  rng = np.random.default_rng(seed)
  X = 0.3 * rng.standard_normal((n, 1, 8, 8)).astype(np.float32)
  y = rng.integers(0, 2, n).astype(np.int32)
  for i in range(n):
    k = rng.integers(1, 7)
    if y[i]: X[i, 0, :, k] += 1.5
    else: X[i, 0, k, :] += 1.5
  return X, y


@pytest.mark.parametrize("opt_cls,kw", OPTIMIZERS, ids=[o.__name__ for o, _ in OPTIMIZERS])
def test_a_small_cnn_learns(opt_cls, kw):
  Tensor.manual_seed(2)
  X, Y = bars()
  conv, head = nn.Conv2d(1, 4, 3, padding=1), nn.Linear(4 * 4 * 4, 2)
  opt = opt_cls([conv.weight, conv.bias, head.weight, head.bias], **kw)
  x, y = Tensor(X), Tensor(Y)
  losses = []
  for _ in range(30):
    opt.zero_grad()
    loss = head(conv(x).relu().max_pool2d(2).flatten(1)).cross_entropy(y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
  assert losses[-1] < losses[0] / 4, losses


def test_zero_grad_and_gradient_accumulation():
  w = Tensor(np.ones(3, np.float32), requires_grad=True)
  opt = nn.SGD([w], lr=1.0)
  (w * 2).sum().backward()
  (w * 3).sum().backward()
  np.testing.assert_array_equal(w.grad.numpy(), [5, 5, 5])
  opt.step()
  np.testing.assert_array_equal(w.numpy(), [-4, -4, -4])
  opt.zero_grad()
  assert w.grad is None


class Model:
  def __init__(self):
    self.layers = [nn.Linear(2, 3), nn.Linear(3, 1)]
    self.norm = {"ln": nn.LayerNorm(3)}
    self.scale = Tensor.ones(1)


def test_state_dict_names_are_dotted_paths():
  sd = nn.get_state_dict(Model())
  assert sorted(sd) == ["layers.0.bias", "layers.0.weight", "layers.1.bias", "layers.1.weight", "norm.ln.bias", "norm.ln.weight", "scale"]


def test_load_state_dict_copies_and_checks():
  a, b = Model(), Model()
  nn.load_state_dict(b, nn.get_state_dict(a))
  for k, t in nn.get_state_dict(b).items(): np.testing.assert_array_equal(t.numpy(), nn.get_state_dict(a)[k].numpy())
  sd = nn.get_state_dict(a)
  with pytest.raises(TensorError, match=r"missing keys \['scale'\], unexpected keys \[\]"):
    nn.load_state_dict(b, {k: v for k, v in sd.items() if k != "scale"})
  with pytest.raises(TensorError, match=r"unexpected keys \['extra'\]"): nn.load_state_dict(b, {**sd, "extra": Tensor.ones(1)})
  with pytest.raises(TensorError, match=r"layers.0.weight has shape \(2, 2\) in the state but \(3, 2\) in the model"):
    nn.load_state_dict(b, {**sd, "layers.0.weight": Tensor.ones(2, 2)})
  nn.load_state_dict(b, {"scale": Tensor([7.0])}, strict=False)
  assert b.scale.item() == 7.0


def test_safetensors_round_trip(tmp_path):
  state = {"w": Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)), "i": Tensor(np.array([1, -2], np.int32)),
           "h": Tensor(np.array([0.5, 1.5], np.float16)), "b": Tensor(np.array([True, False])), "s": Tensor(np.float32(3.0))}
  path = tmp_path / "m.safetensors"
  nn.safe_save(state, path, metadata={"format": "np"})
  raw = path.read_bytes()
  (n,) = struct.unpack("<Q", raw[:8])
  header = json.loads(raw[8:8 + n])
  # the whole header, worked out by hand: entries sorted by name, each one's bytes right after the last one's
  assert header == {"b": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}, "h": {"dtype": "F16", "shape": [2], "data_offsets": [2, 6]},
                    "i": {"dtype": "I32", "shape": [2], "data_offsets": [6, 14]}, "s": {"dtype": "F32", "shape": [], "data_offsets": [14, 18]},
                    "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [18, 42]}, "__metadata__": {"format": "np"}}
  assert (8 + n) % 8 == 0 and len(raw) == 8 + n + 42
  back = nn.safe_load(path)
  for k, t in state.items():
    assert back[k].dtype is t.dtype and back[k].shape == t.shape
    np.testing.assert_array_equal(back[k].numpy(), t.numpy())


# every dtype uopc writes (the Tensor dtypes, and F64 and I64 from NumPy arrays, which safe_save takes too) and reads (all
# six; F64 is read as f32, I64 as i32, as Tensor() takes them), with the safetensors library's name for it
SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "BOOL": np.bool_, "F64": np.float64, "I64": np.int64}
AS_TENSOR = {"F64": np.float32, "I64": np.int32}


def _interchange_arrays() -> dict[str, np.ndarray]:
  """Per dtype: a matrix of awkward values, a 0-d value and two empty shapes."""
  rng = np.random.default_rng(7)
  out = {}
  for name, dt in SAFETENSORS_DTYPES.items():
    if dt is np.bool_: full = rng.random((3, 4)) < 0.5
    elif np.issubdtype(dt, np.integer): full = np.array([[-2**31, 2**31 - 1, 0, -1], [5, 6, 7, 8], [9, -10, 11, 12]], dt)
    else: full = np.array([[np.inf, -np.inf, -0.0, 0.1], [1e-7, 65504.0, -2.5, 3.0], [4.0, 5.0, 6.0, 7.0]], dt)
    out.update({f"{name}.matrix": full, f"{name}.scalar": np.array(full[1, 2], dt),
                f"{name}.empty": full[:0], f"{name}.empty_rows": full[:, :0]})
  return out


def test_uopc_writes_files_the_safetensors_library_reads_for_every_dtype(tmp_path):
  from safetensors.numpy import load_file           # the library itself (the tensor session installs it)
  arrays = _interchange_arrays()
  state = {k: a if k.split(".")[0] in AS_TENSOR else Tensor(a) for k, a in arrays.items()}
  nn.safe_save(state, tmp_path / "u.safetensors", metadata={"by": "uopc"})
  got = load_file(str(tmp_path / "u.safetensors"))
  assert sorted(got) == sorted(arrays)
  for k, want in arrays.items():
    assert got[k].dtype == want.dtype and got[k].shape == want.shape, (k, got[k].dtype, got[k].shape)
    np.testing.assert_array_equal(got[k].reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8), err_msg=k)   # bits, -0.0 too


def test_uopc_reads_files_the_safetensors_library_writes_for_every_dtype(tmp_path):
  from safetensors.numpy import save_file
  arrays = _interchange_arrays()
  save_file(arrays, str(tmp_path / "s.safetensors"), metadata={"by": "safetensors"})
  got, meta = nn.safe_load(tmp_path / "s.safetensors", with_metadata=True)
  assert sorted(got) == sorted(arrays) and meta == {"by": "safetensors"}
  for k, a in arrays.items():
    want = a.astype(AS_TENSOR.get(k.split(".")[0], a.dtype))
    assert got[k].numpy().dtype == want.dtype and got[k].shape == want.shape, (k, got[k].dtype, got[k].shape)
    np.testing.assert_array_equal(got[k].numpy().reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8), err_msg=k)


@pytest.mark.parametrize("corrupt,message", [
  (lambda raw: raw[:5], "too short"),
  (lambda raw: struct.pack("<Q", 10**6) + raw[8:], "the header claims"),
  (lambda raw: raw[:8] + b"{not json" + raw[17:], "not valid JSON"),
  (lambda raw: raw[:-4], "don't fit"),
])
def test_malformed_safetensors_give_a_clear_error(tmp_path, corrupt, message):
  path = tmp_path / "m.safetensors"
  nn.safe_save({"w": Tensor(np.ones(4, np.float32))}, path)
  path.write_bytes(corrupt(path.read_bytes()))
  with pytest.raises(nn.SafetensorsError, match=message): nn.safe_load(path)


@pytest.mark.parametrize("cls, kw", [(nn.Adam, dict(weight_decay=0.1)), (nn.Adam, {}), (nn.AdamW, {}), (nn.AdamW, dict(weight_decay=0.0))])
def test_adams_f32_update_builds_the_graph_of_its_tensor_expressions(cls, kw):
  # the f32 road builds its UOps directly (a plain step's updates were mostly Tensor-op overhead); it must be the same
  # graph, node for node, as the Tensor expressions of the general road, so kernels and numerics are those
  rng = np.random.default_rng(0)
  p = Tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True)
  opt = cls([p], lr=0.01, **kw)
  p.grad = Tensor(rng.standard_normal((3, 4)).astype(np.float32))
  opt._step_state()
  shaped, g = opt._shaped(p), p.grad._stop_gradient()
  m0, v0 = opt.m[0].uop, opt.v[0].uop
  value, _ = opt._update_tensors(0, p, g, shaped)
  want = (value.uop, opt.m[0].uop, opt.v[0].uop, value.requires_grad)
  opt.m[0].uop, opt.v[0].uop = m0, v0
  value, state = opt._update_f32(0, p, g, shaped)
  assert (value.uop, opt.m[0].uop, opt.v[0].uop, value.requires_grad) == want and state[0] is opt.m[0] and state[1] is opt.v[0]
  assert not opt.m[0].requires_grad and not opt.v[0].requires_grad


def _operand(rng, shape, requires_grad: bool, form: str) -> Tensor:
  """A tensor of `shape` held three ways: its own buffer, a reshaped view of a buffer (a realized value reshaped), or a
  lazy value computed from one."""
  if form == "view":
    return Tensor(rng.standard_normal((int(np.prod(shape)),)).astype(np.float32), requires_grad=requires_grad).reshape(*shape)
  t = Tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=requires_grad)
  return t * 2.0 if form == "lazy" else t


@pytest.mark.parametrize("lead", [(2, 3), (1, 1), (6,), (1,)])
@pytest.mark.parametrize("form", ["buffer", "view", "lazy"])
def test_linear_straight_to_uops_builds_the_graph_of_its_tensor_ops(lead, form):
  # linear's common case builds its UOps directly (its Tensor ops were most of a plain GPT step's forward in Python);
  # it must be the same graph, node for node, as the Tensor expressions, so kernels and gradients are theirs
  rng = np.random.default_rng(0)
  for x_grad, w_grad, b_grad, out, bias in [(a, b, c, m, d) for a in (False, True) for b in (False, True) for c in (False, True)
                                            for m in (1, 5) for d in (False, True)]:
    x = _operand(rng, lead + (4,), x_grad, form)
    w = Tensor(rng.standard_normal((out, 4)).astype(np.float32), requires_grad=w_grad)
    b = Tensor(rng.standard_normal((out,)).astype(np.float32), requires_grad=b_grad) if bias else None
    fast = x._linear_uops(w, b)
    y = x.reshape(-1, 4).matmul(w.T).reshape(*lead, out) if len(lead) > 1 else x.matmul(w.T)
    slow = y + b if bias else y
    assert fast is not None and fast.uop is slow.uop and fast.requires_grad == slow.requires_grad
  assert x._linear_uops(w.half(), None) is None and x.half()._linear_uops(w.half(), None) is None   # f16: summed in f32
  assert Tensor(np.ones(4, np.float32))._linear_uops(w, None) is None                              # a vector: matmul's rules


@pytest.mark.parametrize("shape", [(2, 3, 4), (5, 1), (7,)])
@pytest.mark.parametrize("form", ["buffer", "view", "lazy"])
def test_layernorm_straight_to_uops_builds_the_graph_of_its_tensor_ops(shape, form):
  rng = np.random.default_rng(1)
  for x_grad, affine, w_grad, eps in [(a, b, c, e) for a in (False, True) for b in (False, True) for c in (False, True) for e in (1e-5, 0, 1)]:
    x = _operand(rng, shape, x_grad, form)
    ln = nn.LayerNorm(shape[-1], eps=eps, elementwise_affine=affine)
    if affine and not w_grad: ln.weight.requires_grad = False
    fast = x._layernorm_uops(ln.eps, ln.weight, ln.bias)
    y = x.layernorm((-1,), ln.eps)
    slow = y * ln.weight + ln.bias if affine else y
    assert fast is not None and fast.uop is slow.uop and fast.requires_grad == slow.requires_grad
    assert ln(x).uop is slow.uop
  assert x.half()._layernorm_uops(1e-5, None, None) is None   # f16 is normalized in f32 and rounded once (f16_in_f32)


@pytest.fixture
def no_schedules(monkeypatch):
  """Fails the test if anything is scheduled: a realize that would compile and launch a kernel."""
  import uopc.tensor.core
  def forbidden(*a, **k): raise AssertionError("a kernel was scheduled")
  monkeypatch.setattr(uopc.tensor.core, "run_schedule", forbidden)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(), (3,), (2, 5), (0, 4)])
def test_a_constant_leaf_that_requires_grad_is_filled_without_a_kernel(no_schedules, shape, dtype):
  for value in (0.0, 1.0, 0.1, -2.5e-3, 7):
    t = Tensor.full(shape, value, dtype=dtype, requires_grad=True)
    assert t.requires_grad and t.shape == shape and t.dtype.name == {"float32": "f32", "float16": "f16"}[dtype]
    np.testing.assert_array_equal(t.numpy(), np.full(shape, value, dtype))
  a, b = Tensor.zeros(3, requires_grad=True), Tensor.zeros(3, requires_grad=True)
  assert a.uop is not b.uop                     # two leaves, two buffers
  assert Tensor.ones(2, 2, requires_grad=True).numpy().tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_a_lazy_constant_is_the_same_number_as_a_filled_leaf():
  for value in (0.1, 1 / 3, 1e-45, 65504.0, 65520.0, 2.0 ** -25 * (1 + 2.0 ** -30), 1e30, 1e300):
    for dtype in ("float32", "float16"):
      lazy = Tensor.full((4,), value, dtype=dtype).numpy()
      leaf = Tensor.full((4,), value, dtype=dtype, requires_grad=True).numpy()
      np.testing.assert_array_equal(lazy.view(np.uint32 if dtype == "float32" else np.uint16),
                                    leaf.view(np.uint32 if dtype == "float32" else np.uint16))


def test_an_integer_leaf_that_requires_grad_is_still_refused():
  with pytest.raises(TensorError, match="only float tensors"): Tensor.full((2,), 1, dtype="int32", requires_grad=True)


@pytest.mark.parametrize("make, per_param", [(lambda ps: nn.AdamW(ps), 2), (lambda ps: nn.Adam(ps), 2),
                                             (lambda ps: nn.SGD(ps, momentum=0.9), 1)])
def test_an_optimizers_state_starts_as_zeros_without_a_kernel(no_schedules, make, per_param):
  ps = [Tensor(np.ones((3, 4), np.float32), requires_grad=True), Tensor(np.ones(5, np.float32), requires_grad=True)]
  opt = make(ps)
  state = [*getattr(opt, "m", []), *getattr(opt, "v", []), *getattr(opt, "buf", [])]
  assert len(state) == per_param * len(ps)
  for s, p in zip(state, ps * per_param):
    assert s.shape == p.shape and s.dtype.name == "f32" and s.uop is not p.uop
    assert not s.numpy().any()
