"""The hostile-input catalogue of uopc-tensor: Tensor construction and every op family, nn, safetensors and uopc.jit,
given what a hostile (or careless) user gives them. Oracles: NumPy (NaN semantics, sums, empty batches), PyTorch's
documented behaviour (an out-of-range index is an error, ignore_index excepted), and the rule that anything else is a
one-line TensorError (or SafetensorsError) that says what was wrong: no RecursionError, MemoryError,
ZeroDivisionError, AttributeError, TypeError, ValueError or raw OSError, and no silently wrong answer."""
import json, os, stat, struct, subprocess, sys, textwrap
from pathlib import Path
import numpy as np
import pytest
from uopc import nn
from uopc.jit import jit
from uopc.backends import BackendError
from uopc.tensor import Tensor, TensorError
from uopc.nn import SafetensorsError, safe_save, safe_load
from hostile import raises_one_line

NAN = float("nan")


def one_line(fn, kind=TensorError, match: str | None = None) -> str: return raises_one_line(fn, kind, match, limit=600)


# ---- integer indices out of range are errors (PyTorch's rule), checked on the realized values -----------------------------

def test_an_index_past_the_end_is_an_error_not_a_zero():
  one_line(lambda: Tensor.arange(5)[Tensor([7])], match="index 7 is out of range for axis 0 of size 5")
  one_line(lambda: Tensor.arange(5)[Tensor([-6])], match="index -6 is out of range")
  one_line(lambda: Tensor.arange(5)[[0, 5]], match="index 5 is out of range")
  one_line(lambda: Tensor.arange(12).reshape(3, 4)[Tensor([0, 1]), Tensor([2, 4])], match="index 4 is out of range for axis 1 of size 4")
  x = np.arange(12).reshape(3, 4)
  np.testing.assert_array_equal(Tensor(x)[Tensor([-1, 0, 2])].numpy(), x[[-1, 0, 2]])     # every legal index still works
  np.testing.assert_array_equal(Tensor(x)[:, Tensor([[3], [-4]])].numpy(), x[:, [[3], [-4]]])


def test_embedding_gather_scatter_one_hot_and_losses_refuse_out_of_range_indices():
  one_line(lambda: nn.Embedding(4, 2)(Tensor([4])), match="embedding: index 4 is out of range for 4 embeddings")
  one_line(lambda: nn.Embedding(4, 2)(Tensor([[0, -1]])), match="embedding: index -1")            # torch refuses negatives too
  one_line(lambda: Tensor.zeros(2, 3).gather(1, Tensor([[0], [3]])), match="gather: index 3 is out of range for dim 1 of size 3")
  one_line(lambda: Tensor.zeros(2, 3).gather(0, Tensor([[-1, 0, 0]])), match="gather: index -1")
  one_line(lambda: Tensor.zeros(1, 4).cross_entropy(Tensor([9])), match="cross_entropy: target 9 is out of range for 4 classes")
  one_line(lambda: Tensor.zeros(3, 4).log_softmax(1).nll_loss(Tensor([0, 1, 4])), match="nll_loss: target 4 is out of range for 4 classes")
  one_line(lambda: Tensor.zeros(3, 4).scatter(1, Tensor([[5]]), 1.0), match="scatter: index 5 is out of range for dim 1 of size 4")
  one_line(lambda: Tensor.zeros(3, 4).scatter_reduce(0, Tensor([[-1]]), Tensor([[1.0]]), "sum"), match="scatter: index -1")
  one_line(lambda: Tensor([5]).one_hot(3), match="one_hot: class 5 is out of range for 3 classes")
  one_line(lambda: Tensor.zeros(2, 4).cross_entropy(Tensor([0, -5]), ignore_index=-100), match="target -5")


def test_ignore_index_is_the_one_out_of_range_target_allowed():
  logits = np.array([[1.0, 2.0, 0.5], [0.1, 0.2, 3.0], [2.0, 2.0, 2.0]], np.float32)
  target = np.array([1, -100, 2], np.int32)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  expected = -(logp[0, 1] + logp[2, 2]) / 2                                                  # the mean over the kept targets
  assert np.isclose(Tensor(logits).cross_entropy(Tensor(target)).item(), expected, rtol=1e-6)
  assert np.isclose(Tensor(logits).cross_entropy(Tensor([1, 7, 2]), ignore_index=7).item(), expected, rtol=1e-6)


def test_a_computed_index_is_realized_and_checked():
  x = Tensor(np.array([[0.0, 5.0], [9.0, 1.0]], np.float32))
  i = x.argmax(-1)                                                                           # lazy: [1, 0]
  np.testing.assert_array_equal(Tensor([10.0, 20.0])[i].numpy(), [20.0, 10.0])
  one_line(lambda: Tensor([10.0, 20.0])[i + 1], match="index 2 is out of range")


def test_a_jit_replay_repeats_the_index_check_and_a_refused_call_changes_no_state():
  # lr 0.1 scales a used row by 0.8 a step: a replay that read the refused call's state (or an older one) drifts from the
  # plain twin below (lr 0.5 would send every used row to 0 whatever state it read)
  def trainer():
    Tensor.manual_seed(3)
    emb = nn.Embedding(5, 3)
    opt = nn.SGD([emb.weight], lr=0.1)
    def step(tokens):
      opt.zero_grad()
      loss = (emb(tokens) ** 2).sum()
      loss.backward()
      opt.step()
      return loss
    return emb, step
  emb, step = trainer()
  twin, plain = trainer()
  step = jit(step)
  for tokens in ([0, 4], [0, 1], [4, 4]): step(Tensor(tokens)), plain(Tensor(tokens))        # run, capture, replay
  assert step._plans[0].checks, "the capture recorded the embedding's index check"
  after = emb.weight.numpy().copy()
  np.testing.assert_array_equal(after, twin.weight.numpy())
  one_line(lambda: step(Tensor([1, 5])), match="embedding: index 5 is out of range for 5 embeddings")
  np.testing.assert_array_equal(emb.weight.numpy(), after)                                   # the refused call changed nothing
  for tokens in ([2, 3], [1, 2], [1, 1]):                                                    # and the next calls read the real state
    np.testing.assert_array_equal(step(Tensor(tokens)).numpy(), plain(Tensor(tokens)).numpy())
    np.testing.assert_array_equal(emb.weight.numpy(), twin.weight.numpy())
  assert not np.array_equal(emb.weight.numpy(), after)


# ---- NaN like NumPy ----------------------------------------------------------------------------------------------------------

X = np.array([[1.0, NAN, 3.0, NAN], [-2.0, -0.0, 0.0, 5.0], [NAN, NAN, NAN, NAN]], np.float32)


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_argmax_and_argmin_give_the_first_nan_like_numpy(axis):
  np.testing.assert_array_equal(Tensor(X).argmax(axis).numpy(), np.argmax(X, axis))
  np.testing.assert_array_equal(Tensor(X).argmin(axis).numpy(), np.argmin(X, axis))
  assert Tensor([1.0, NAN, 3.0]).argmax().item() == 1


def test_relu_maximum_minimum_clip_and_comparisons_keep_nan_like_numpy():
  y = np.array([[0.5, 2.0, NAN, -1.0], [NAN, 1.0, -0.5, 5.0], [0.0, NAN, 1.0, -1.0]], np.float32)
  t, u = Tensor(X), Tensor(y)
  with np.errstate(invalid="ignore"):
    np.testing.assert_array_equal(t.relu().numpy(), np.maximum(X, 0))
    np.testing.assert_array_equal(t.maximum(u).numpy(), np.maximum(X, y))
    np.testing.assert_array_equal(t.minimum(u).numpy(), np.minimum(X, y))
    np.testing.assert_array_equal(t.clip(-1, 2).numpy(), np.clip(X, -1, 2))
    np.testing.assert_array_equal(t.sign().numpy(), np.sign(X))                               # found by the NumPy fuzzer: sign(nan) was 0
    zeros = Tensor(np.array([0.0, -0.0], np.float32))                                          # found by the fuzzer: abs(0.0) was -0.0
    np.testing.assert_array_equal((1 / zeros.abs()).numpy(), [np.inf, np.inf])
    assert not np.signbit(zeros.abs().numpy()).any()
    for op in ("__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"):
      np.testing.assert_array_equal(getattr(t, op)(u).numpy(), getattr(X, op)(y), err_msg=op)
      np.testing.assert_array_equal(getattr(t, op)(1.0).numpy(), getattr(X, op)(np.float32(1.0)), err_msg=op)
    np.testing.assert_array_equal((Tensor([1, 2]) <= NAN).numpy(), [False, False])
    np.testing.assert_array_equal(t.max(1).numpy(), X.max(1))
    np.testing.assert_array_equal(t.min(0).numpy(), X.min(0))


def test_integer_min_minimum_and_argmin_hold_at_int_min():
  # min was -max(-x), and -INT_MIN is INT_MIN again: min([INT_MIN, 5]) was 5
  a, b = np.array([-2**31, 5, 2**31 - 1], np.int32), np.array([3, -2**31, 2**31 - 1], np.int32)
  assert Tensor(a).min().item() == -2**31 and Tensor(a).argmin().item() == 0 and Tensor(a).max().item() == 2**31 - 1
  np.testing.assert_array_equal(Tensor(a).minimum(Tensor(b)).numpy(), np.minimum(a, b))
  np.testing.assert_array_equal(Tensor(a).minimum(7).numpy(), np.minimum(a, 7))
  np.testing.assert_array_equal(Tensor(a.reshape(3, 1)).min(1).numpy(), a)


# ---- f32 sums: exact past 2**24 -------------------------------------------------------------------------------------------------

def test_a_long_f32_sum_does_not_saturate_at_2_to_the_24():
  # a sum kept in one f32 stops growing at 2**24 (2**24 + 1 rounds back down); chunked and vectorized partial sums don't.
  # The counts are even, so the exact sum is an f32 too
  for n in (2**24 + 2, 2**24 + 2**20 + 6, 3 * 2**23 + 2):
    assert Tensor.ones(n).sum().item() == n
  assert Tensor.ones(2**12, 2**12 + 1).sum().item() == 2**12 * (2**12 + 1)


# ---- sizes: refused where the tensor is made ----------------------------------------------------------------------------------

TOO_BIG = {
  "ones(2**20, 2**20)": lambda: Tensor.ones(2**20, 2**20).sum(),
  "zeros(10**12)": lambda: Tensor.zeros(10**12),
  "rand(10**12)": lambda: Tensor.rand(10**12),
  "arange(10**12)": lambda: Tensor.arange(10**12),
  "eye(10**6)": lambda: Tensor.eye(10**6),
  "an expand": lambda: Tensor.ones(1).expand(2**16, 2**16),
  "a broadcast": lambda: Tensor.ones(2**16, 1) * Tensor.ones(1, 2**16),
  "a pad": lambda: Tensor.ones(4).pad(((0, 2**31),)),
  "a repeat": lambda: Tensor.ones(4).repeat(2**30),
}


@pytest.mark.parametrize("case", list(TOO_BIG))
def test_a_tensor_past_the_index_limit_is_refused_where_it_is_made(case):
  one_line(TOO_BIG[case], match="more than the 2147483647 an i32 index can reach")


def test_creation_sizes_are_non_negative_integers():
  one_line(lambda: Tensor.zeros(2.7), match="integers, got (2.7,)")
  one_line(lambda: Tensor.full(2.7, 1.0), match="integers")
  one_line(lambda: Tensor.zeros(3, -1), match="can't be negative")
  one_line(lambda: Tensor.ones(1).expand(-3), match="can't be negative")
  one_line(lambda: Tensor.arange(NAN), match="must be finite")
  assert Tensor.zeros(np.int64(3)).shape == (3,) and Tensor.ones((2, 0)).shape == (2, 0)
  big = (Tensor.ones(2048, 2048) @ Tensor.ones(2048, 2048))                                   # a product of 2**33 stays legal
  assert big.shape == (2048, 2048)


# ---- empty batches --------------------------------------------------------------------------------------------------------------

def test_empty_batch_softmax_log_softmax_and_cross_entropy():
  x = Tensor.zeros(0, 4)
  assert x.softmax(-1).numpy().shape == (0, 4) and x.log_softmax(-1).numpy().shape == (0, 4)
  target = Tensor(np.zeros(0, np.int32))
  assert np.isnan(x.cross_entropy(target).item())                                          # torch: the mean of nothing is nan
  assert x.cross_entropy(target, reduction="sum").item() == 0.0
  assert x.cross_entropy(target, reduction="none").numpy().shape == (0,)
  assert Tensor.zeros(0).any().item() is False and Tensor.zeros(0).all().item() is True


def test_float_floor_division_and_modulo_of_infinities_follow_numpy():
  # found by the NumPy fuzzer: inf // 1.0 was inf (NumPy goes through fmod: nan), and x // inf, x % inf were off too
  a = np.array([np.inf, -np.inf, 1, -1, 0, -0.0, 5, -5, np.inf, 1, 7.5, -7.5, NAN, 3], np.float32)
  b = np.array([1, 2, np.inf, np.inf, np.inf, -np.inf, -np.inf, -np.inf, 0, 0, 2, 2, 1, NAN], np.float32)
  with np.errstate(all="ignore"):
    np.testing.assert_array_equal((Tensor(a) // Tensor(b)).numpy(), a // b)
    np.testing.assert_array_equal((Tensor(a) % Tensor(b)).numpy(), a % b)
  # and found next: 1 // 0.1 was 10 (the remainder, rounded twice, looked like 0; NumPy says 9), and a % b was off by an ulp in
  # 6 of 10 random cases; both now take the remainder as one fused multiply-add
  assert (Tensor(np.float32(1.0)) // Tensor(np.float32(0.1))).item() == 9.0
  rng = np.random.default_rng(0)
  x, y = (rng.standard_normal(4096) * 10).astype(np.float32), rng.standard_normal(4096).astype(np.float32)
  np.testing.assert_array_equal((Tensor(x) // Tensor(y)).numpy(), x // y)
  np.testing.assert_array_equal((Tensor(x) % Tensor(y)).numpy(), x % y)


def test_an_empty_matmul_fused_into_a_sum_runs():
  # found by the NumPy fuzzer: choose_opts divided by the reduced size, 0 (v3 = v1 @ v1 with v1 empty, then v0 + v3)
  assert (Tensor(2.5) + Tensor.zeros(0) @ Tensor.zeros(0)).item() == 2.5
  np.testing.assert_array_equal((Tensor.ones(3, 1) + Tensor.zeros(3, 0).sum(1, keepdim=True)).numpy(), np.ones((3, 1)))


def test_argmax_of_nothing_is_refused_like_numpy():
  # it was the index INT_MIN; NumPy and PyTorch raise. (max and min of nothing are their identities, -inf and inf, as
  # every reduction over an empty axis.) A reduction whose result is empty is fine
  assert Tensor.zeros(3, 0).max(1).numpy().tolist() == [-np.inf] * 3 and Tensor.zeros(0).min().item() == np.inf
  for op in ("argmax", "argmin"):
    one_line(lambda: getattr(Tensor.zeros(0), op)(), match=f"{op} over an axis of size 0")
    one_line(lambda: getattr(Tensor.zeros(3, 0), op)(1), match=f"{op} over an axis of size 0 (shape (3, 0))")
    assert getattr(Tensor.zeros(0, 3), op)(1).numpy().shape == (0,) == getattr(np.zeros((0, 3)), op)(1).shape
  assert Tensor.zeros(3, 0).softmax(-1).numpy().shape == (3, 0) and Tensor.zeros(3, 0).log_softmax(-1).numpy().shape == (3, 0)


# ---- nn ---------------------------------------------------------------------------------------------------------------------

class Holder:
  def __init__(self): self.w, self.b = Tensor.zeros(2, 2), Tensor.zeros(2)


NN_ERRORS = {
  "Conv2d(groups=0)": (lambda: nn.Conv2d(2, 2, 3, groups=0), "groups must be an int of at least 1"),
  "Conv2d(stride=0)": (lambda: nn.Conv2d(2, 2, 3, stride=0), "stride must be an int or a tuple of ints of at least 1"),
  "Conv2d(kernel_size=0)": (lambda: nn.Conv2d(2, 2, 0), "kernel_size must be"),
  "Conv2d(dilation=(1, 0))": (lambda: nn.Conv2d(2, 2, 3, dilation=(1, 0)), "dilation must be"),
  "Conv2d(padding=-1)": (lambda: nn.Conv2d(2, 2, 3, padding=-1), "padding must be an int or a tuple of ints of at least 0"),
  "Conv2d(3, 2, groups=2)": (lambda: nn.Conv2d(3, 2, 1, groups=2), "not divisible by groups=2"),
  "conv2d(stride=0)": (lambda: Tensor.ones(1, 1, 4, 4).conv2d(Tensor.ones(1, 1, 2, 2), stride=0), "stride must be"),
  "conv2d(groups=0)": (lambda: Tensor.ones(1, 2, 4, 4).conv2d(Tensor.ones(2, 2, 3, 3), groups=0), "groups must be"),
  "max_pool2d(0)": (lambda: Tensor.ones(1, 1, 4, 4).max_pool2d(0), "kernel_size must be"),
  "avg_pool2d(stride=0)": (lambda: Tensor.ones(1, 1, 4, 4).avg_pool2d(2, 0), "stride must be"),
  "Linear(-1, 3)": (lambda: nn.Linear(-1, 3), "in_features must be a non-negative int, got -1"),
  "Linear(2.5, 3)": (lambda: nn.Linear(2.5, 3), "in_features must be a non-negative int"),
  "Embedding(4, -2)": (lambda: nn.Embedding(4, -2), "embedding_dim must be a non-negative int"),
  "LayerNorm(2.5)": (lambda: nn.LayerNorm(2.5), "normalized_shape must be an int or a tuple of ints"),
  "load_state_dict of strings": (lambda: nn.load_state_dict(Holder(), {"w": "hello", "b": [0, 0]}), "w is a str, not a Tensor"),
  "load_state_dict of None": (lambda: nn.load_state_dict(Holder(), {"w": None, "b": [0, 0]}), "w is a NoneType"),
  "load_state_dict of a list": (lambda: nn.load_state_dict(Holder(), [("w", Tensor.ones(2, 2))]), "takes a dict"),
  "load_state_dict of the wrong shape": (lambda: nn.load_state_dict(Holder(), {"w": [1.0], "b": [0, 0]}), "w has shape (1,)"),
  "dropout(p=2)": (lambda: Tensor.ones(3).dropout(2), "p must be in [0, 1]"),
  "an optimizer of strings": (lambda: nn.SGD(["w"]), "must be Tensors"),
  "an optimizer of an int": (lambda: nn.SGD(3), "takes a list of parameters"),
  "a learning rate of 'a'": (lambda: nn.SGD([Tensor.zeros(2, requires_grad=True)], lr="a"), "lr must be a number"),
  "a NaN learning rate": (lambda: nn.Adam([Tensor.zeros(2, requires_grad=True)], lr=NAN), "lr must be a number in [0.0, inf)"),
  "a learning rate set to a string": (lambda: setattr(nn.SGD([Tensor.zeros(2, requires_grad=True)]), "lr", "x"), "lr must be a number"),
  "one beta": (lambda: nn.Adam([Tensor.zeros(2, requires_grad=True)], betas=(0.9,)), "betas must be a pair"),
  "a beta of 1": (lambda: nn.AdamW([Tensor.zeros(2, requires_grad=True)], betas=(1.0, 0.9)), "betas[0] must be a number in [0.0, 1.0)"),
  "a momentum of None": (lambda: nn.SGD([Tensor.zeros(2, requires_grad=True)], momentum=None), "momentum must be a number"),
  "safe_save metadata of an int": (lambda: safe_save({"a": Tensor([1.0])}, "unused.safetensors", metadata=3), "metadata must be a dict"),
  "jit of an int": (lambda: jit(3), "jit takes a function"),
}


@pytest.mark.parametrize("case", list(NN_ERRORS))
def test_nn_refuses_malformed_layers_and_states(case):
  fn, match = NN_ERRORS[case]
  one_line(fn, match=match)


def test_load_state_dict_takes_arrays_and_lists_of_numbers():
  h = Holder()
  nn.load_state_dict(h, {"w": [[1, 2], [3, 4]], "b": np.array([5.0, 6.0])})
  np.testing.assert_array_equal(h.w.numpy(), [[1, 2], [3, 4]])
  np.testing.assert_array_equal(h.b.numpy(), [5, 6])


def test_an_empty_device_means_the_default(monkeypatch):
  monkeypatch.setenv("UOPC_DEVICE", "")
  assert Tensor([1.0]).device == "C" and (Tensor([1.0]) * 2).numpy()[0] == 2.0
  monkeypatch.setenv("UOPC_DEVICE", "   ")
  assert Tensor([1.0], device="").device == "C"


# ---- safetensors ---------------------------------------------------------------------------------------------------------------

def write_st(path: Path, header: dict, data: bytes = b"") -> Path:
  h = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(h)) + h + data)
  return path


ENTRY = lambda dtype="F32", shape=(1,), offsets=(0, 4): {"a": {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}}
ST_ERRORS = {
  "an I64 past i32": ({"a": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}, struct.pack("<qq", 1, 2**40), "holds I64 values outside i32"),
  "a negative shape": (ENTRY(shape=(-1,)), b"\0" * 4, "a shape is a list of non-negative integers"),
  "two negative sizes": (ENTRY(shape=(-1, -4)), b"\0" * 16, "a shape is a list of non-negative integers"),
  "a fractional shape": (ENTRY(shape=(1.5,)), b"\0" * 4, "a shape is a list"),
  "a boolean shape": (ENTRY(shape=(True,)), b"\0" * 4, "a shape is a list"),
  "a string for the shape": ({"a": {"dtype": "F32", "shape": "ab", "data_offsets": [0, 4]}}, b"\0" * 4, "a shape is a list"),
  "string offsets": (ENTRY(offsets=("0", "4")), b"\0" * 4, "they are two integers"),
  "three offsets": (ENTRY(offsets=(0, 4, 8)), b"\0" * 8, "they are two integers"),
  "no offsets": ({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4, "they are two integers"),
  "offsets past the file": (ENTRY(offsets=(0, 400)), b"\0" * 4, "don't fit its shape"),
  "offsets of the wrong length": (ENTRY(offsets=(0, 8)), b"\0" * 8, "don't fit its shape"),
  "an unknown dtype": (ENTRY(dtype="Q7"), b"\0" * 4, "has dtype 'Q7'"),
  "an entry that is a number": ({"a": 5}, b"", "is int, not a JSON object"),
  "a header that is a list": ([1, 2], b"", "not a JSON object"),
  "a header nested 100,000 deep": (None, b"", "nests too deeply"),
  "string metadata values": ({"__metadata__": {"a": 1}}, b"", "__metadata__ must map strings to strings"),
  "an empty axis beside a huge one": (ENTRY(shape=(0, 10**30), offsets=(0, 0)), b"", "an i32 index can reach"),
  "70 dimensions": (ENTRY(shape=(1,) * 70), b"\0" * 4, "(at most 32)"),
}


@pytest.mark.parametrize("case", list(ST_ERRORS))
def test_a_malformed_safetensors_file_is_a_safetensors_error_naming_what(case, tmp_path):
  header, data, match = ST_ERRORS[case]
  p = tmp_path / "x.safetensors"
  if header is None:
    h = b"[" * 100_000 + b"]" * 100_000
    p.write_bytes(struct.pack("<Q", len(h)) + h)
  else: write_st(p, header, data)
  one_line(lambda: safe_load(p, with_metadata=True), SafetensorsError, match)


def test_safetensors_files_that_are_not_files(tmp_path):
  one_line(lambda: safe_load(tmp_path / "missing.safetensors"), SafetensorsError, "can't read it (No such file or directory)")
  one_line(lambda: safe_load(tmp_path), SafetensorsError, "can't read it (Is a directory)")
  one_line(lambda: safe_load("/dev/zero"), SafetensorsError, "not a regular file")
  (tmp_path / "short").write_bytes(b"\1\2")
  one_line(lambda: safe_load(tmp_path / "short"), SafetensorsError, "too short")
  write_st(tmp_path / "lies", {})
  (tmp_path / "lies").write_bytes(struct.pack("<Q", 10**12) + b"{}")
  one_line(lambda: safe_load(tmp_path / "lies"), SafetensorsError, "the header claims")
  digits = b'{"a":{"dtype":"F32","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,4]}}'   # past python's int-string limit
  (tmp_path / "digits").write_bytes(struct.pack("<Q", len(digits)) + digits + b"\0" * 4)
  one_line(lambda: safe_load(tmp_path / "digits"), SafetensorsError, "not valid JSON")
  one_line(lambda: safe_save({"a": Tensor([1.0])}, tmp_path / "no" / "dir" / "x.safetensors"), SafetensorsError, "can't write it")
  one_line(lambda: safe_save({1: Tensor([1.0])}, tmp_path / "x.safetensors"), TensorError, "a dict of name (a str)")
  for bad in (3, None, "a\0b"):
    one_line(lambda: safe_load(bad), SafetensorsError, "a file name is a str or a Path")
    one_line(lambda: safe_save({"a": Tensor([1.0])}, bad), SafetensorsError, "a file name is a str or a Path")
  one_line(lambda: safe_save({"a": [[1.0], [1.0, 2.0]]}, tmp_path / "x.safetensors"), TensorError, "a is ragged or not numbers")


def test_safe_load_reads_only_the_data_its_entries_use(tmp_path):
  # a 1 TiB sparse file was read whole (a MemoryError); the entries' data is all that is read now
  p = tmp_path / "big.safetensors"
  safe_save({"a": Tensor([1.0, 2.0])}, p)
  with open(p, "r+b") as f: f.truncate(2**40)
  assert safe_load(p)["a"].tolist() == [1.0, 2.0]


def test_safe_save_through_a_symlink_writes_its_target(tmp_path):
  target, link = tmp_path / "real.safetensors", tmp_path / "link.safetensors"
  safe_save({"a": Tensor([1.0])}, target)
  link.symlink_to(target)
  safe_save({"a": Tensor([2.0])}, link)
  assert link.is_symlink() and safe_load(target)["a"].tolist() == [2.0]


def test_ragged_and_deeply_nested_data_is_a_tensor_error():
  one_line(lambda: Tensor([[1], [1, 2]]), TensorError, "ragged or not numbers")
  deep = 1.0
  for _ in range(100_000): deep = [deep]
  one_line(lambda: Tensor(deep), TensorError, "ragged or not numbers")


def test_i64_and_f64_within_range_load_as_i32_and_f32(tmp_path):
  header = {"i": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}, "f": {"dtype": "F64", "shape": [1], "data_offsets": [16, 24]}}
  p = write_st(tmp_path / "ok.safetensors", header, struct.pack("<qqd", -2**31, 2**31 - 1, 0.1))
  got = safe_load(p)
  assert got["i"].tolist() == [-2**31, 2**31 - 1] and got["f"].tolist() == [np.float32(0.1)]


def test_safe_save_leaves_a_user_file_named_like_its_temporary_alone(tmp_path):
  path = tmp_path / "model.safetensors"
  (tmp_path / "model.safetensors.tmp").write_text("the user's own file")
  safe_save({"w": Tensor([1.0, 2.0])}, path)
  assert (tmp_path / "model.safetensors.tmp").read_text() == "the user's own file"
  assert safe_load(path)["w"].tolist() == [1.0, 2.0]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", "model.safetensors.tmp"]
  assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()                                 # the mode open() would give


def _umask() -> int:
  m = os.umask(0)
  os.umask(m)
  return m


def test_a_failed_save_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
  path = tmp_path / "model.safetensors"
  safe_save({"w": Tensor([1.0])}, path)
  def disk_full(fd): raise OSError(28, "No space left on device")
  monkeypatch.setattr(os, "fsync", disk_full)
  one_line(lambda: safe_save({"w": Tensor([2.0])}, path), SafetensorsError, "can't write it (No space left on device)")
  monkeypatch.undo()
  assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"] and safe_load(path)["w"].tolist() == [1.0]
  with pytest.raises(TensorError): safe_save({"w": Tensor([2.0]), "s": np.array(["text"])}, path)   # refused before writing
  assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


SAVER = textwrap.dedent("""
  import sys, numpy as np
  from uopc.nn import safe_save
  value, path = float(sys.argv[1]), sys.argv[2]
  for _ in range(int(sys.argv[3])): safe_save({"w": np.full(50_000, value, np.float32)}, path, metadata={"by": sys.argv[1]})
""")


def test_two_processes_saving_to_one_path_always_leave_a_whole_file(tmp_path):
  path = tmp_path / "shared.safetensors"
  procs = [subprocess.Popen([sys.executable, "-c", SAVER, str(v), str(path), "30"], stderr=subprocess.PIPE, text=True) for v in (1.0, 2.0)]
  seen = set()
  while any(p.poll() is None for p in procs):
    if path.exists():                                       # a reader at any moment sees one whole file or the other
      w, meta = safe_load(path, with_metadata=True)
      values = set(np.unique(w["w"].numpy()).tolist())
      assert len(values) == 1 and values == {float(meta["by"])}
      seen |= values
  for p in procs: assert p.wait() == 0, p.stderr.read()
  w, meta = safe_load(path, with_metadata=True)
  assert set(np.unique(w["w"].numpy()).tolist()) == {float(meta["by"])}
  assert [p.name for p in tmp_path.iterdir()] == ["shared.safetensors"]                      # no temporary left by either


# ---- any junk argument to any method: a TensorError, never a python error from inside -------------------------------------------

JUNK = [None, -1, 0, 2.5, 10**20, "a", (1,), (1, 2), [0, 1], ((1, 2),), [(1,)], (None,), {}, slice(1, None, 0), Ellipsis, True, NAN,
        np.array([1, 2]), object()]
_t = lambda: Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
METHODS = {
  "reshape": lambda j: _t().reshape(j), "permute": lambda j: _t().permute(j), "sum": lambda j: _t().sum(j), "max": lambda j: _t().max(j),
  "argmax": lambda j: _t().argmax(j), "getitem": lambda j: _t()[j], "pad": lambda j: _t().pad(j), "shrink": lambda j: _t().shrink(j),
  "expand": lambda j: _t().expand(j), "transpose": lambda j: _t().transpose(j), "squeeze": lambda j: _t().squeeze(j),
  "unsqueeze": lambda j: _t().unsqueeze(j), "flatten": lambda j: _t().flatten(j), "flip": lambda j: _t().flip(j),
  "split": lambda j: _t().split(j), "chunk": lambda j: _t().chunk(j), "repeat": lambda j: _t().repeat(j), "cast": lambda j: _t().cast(j),
  "add": lambda j: _t() + j, "pow": lambda j: _t() ** j, "matmul": lambda j: _t() @ j, "where": lambda j: (_t() > 1).where(j, 0.0),
  "clip": lambda j: _t().clip(j, None), "cat": lambda j: _t().cat(j), "softmax": lambda j: _t().softmax(j),
  "dropout": lambda j: _t().dropout(j), "full": lambda j: Tensor.full(j, 1.0), "arange": lambda j: Tensor.arange(j),
  "eye": lambda j: Tensor.eye(j), "Tensor": lambda j: Tensor(j), "dtype": lambda j: Tensor([1], dtype=j),
  "device": lambda j: Tensor([1], device=j), "gather": lambda j: _t().gather(0, j),
  "cross_entropy": lambda j: _t().cross_entropy(j), "embedding": lambda j: Tensor([0]).embedding(j),
  "conv2d": lambda j: _t().reshape(1, 1, 2, 3).conv2d(j), "max_pool2d": lambda j: _t().reshape(1, 1, 2, 3).max_pool2d(j),
  "assign": lambda j: _t().assign(j), "backward": lambda j: Tensor([1.0], requires_grad=True).sum().backward(j),
  "and": lambda j: _t() & j, "var": lambda j: _t().var(correction=j), "linear": lambda j: _t().linear(j),
  "attention": lambda j: _t().scaled_dot_product_attention(j, _t()),
  "interpolate size": lambda j: _t().reshape(1, 1, 2, 3).interpolate(size=j),
  "interpolate scale": lambda j: _t().reshape(1, 1, 2, 3).interpolate(scale_factor=j, mode="bilinear"),
  "manual_seed": lambda j: Tensor.manual_seed(j),
  "full of an i32": lambda j: Tensor.full((2,), j, "i32"),   # NaN, 10**20: a raw ValueError and a UOpError before
  "pad value of an i32": lambda j: Tensor([1, 2]).pad(((1, 1),), value=j),
}


@pytest.mark.parametrize("method", list(METHODS))
def test_junk_arguments_give_a_result_or_a_tensor_error(method):
  for j in JUNK:
    try:
      r = METHODS[method](j)
      for t in (r if isinstance(r, list) else [r]):
        if isinstance(t, Tensor): t.realize()
    except (TensorError, BackendError) as e: assert str(e) and "\n" not in str(e), (method, j)   # an unknown device: BackendError


def test_an_optimizer_given_a_parameter_twice_warns_as_torch_does():
  w = Tensor.zeros(2, requires_grad=True)
  with pytest.warns(UserWarning, match="given more than once"): nn.SGD([w, w])
