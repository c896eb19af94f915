"""uopc.onnx's loader and model object: inputs by name or position, declared output types, initializers made once,
shape-like inputs folded on the host, NotImplementedError for what isn't supported, the narrow and wide integer rules,
and serving under uopc.jit. The models are built here with onnx.helper; the oracle is NumPy."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
import uopc.onnx
from uopc.onnx import OnnxError
from uopc.tensor import Tensor, TensorError


def model_of(nodes, inputs, outputs, inits=(), opset=21):
  g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def vi(name, elem, shape): return helper.make_tensor_value_info(name, elem, shape)


def mlp():
  w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4) / 10, "w")
  b = numpy_helper.from_array(np.array([1, -1, 0.5, 0], np.float32), "b")
  nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
  return model_of(nodes, [vi("x", TensorProto.FLOAT, ["batch", 3])], [vi("y", TensorProto.FLOAT, ["batch", 4])], [w, b])


def test_mlp_by_position_and_by_name_matches_numpy():
  m = uopc.onnx.load(mlp())
  x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
  want = np.maximum(x @ (np.arange(12, dtype=np.float32).reshape(3, 4) / 10) + np.array([1, -1, 0.5, 0], np.float32), 0)
  (a,) = m(x)
  (b,) = m(x=x)
  (c,) = m(Tensor(x))
  for got in (a, b, c):
    assert got.dtype == np.float32 and got.shape == (5, 4)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  assert [s.name for s in m.inputs] == ["x"] and m.inputs[0].shape == ("batch", 3)


def test_a_model_loads_from_a_file_and_from_bytes(tmp_path):
  path = tmp_path / "mlp.onnx"
  onnx.save(mlp(), str(path))
  x = np.ones((2, 3), np.float32)
  np.testing.assert_array_equal(uopc.onnx.load(path)(x)[0], uopc.onnx.load(path.read_bytes())(x)[0])


def test_initializers_become_tensors_once():
  m = uopc.onnx.load(mlp(), use_jit=False)
  m(np.ones((2, 3), np.float32))
  first = dict(m.graph.constants)
  m(np.ones((4, 3), np.float32))
  assert set(first) == {"w", "b"} and all(m.graph.constants[k] is first[k] for k in first)


def test_bad_inputs_are_errors_naming_them():
  m = uopc.onnx.load(mlp())
  with pytest.raises(OnnxError, match="missing"): m()
  with pytest.raises(OnnxError, match="no input 'z'"): m(z=np.ones((1, 3), np.float32))
  with pytest.raises(OnnxError, match="declares"): m(np.ones((2, 5), np.float32))
  with pytest.raises(OnnxError, match="2 inputs given"): m(np.ones((2, 3), np.float32), np.ones(1))


def test_int64_outputs_come_back_int64_and_values_past_i32_are_refused():
  nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
  m = uopc.onnx.load(model_of(nodes, [vi("a", TensorProto.INT64, [3]), vi("b", TensorProto.INT64, [3])], [vi("y", TensorProto.INT64, [3])]))
  (y,) = m(np.array([1, -2, 3], np.int64), np.array([10, 20, 30], np.int64))
  assert y.dtype == np.int64 and y.tolist() == [11, 18, 33]
  with pytest.raises(OnnxError, match="doesn't fit"): m(np.array([2**40, 0, 0], np.int64), np.zeros(3, np.int64))
  # the sum leaves i32: an error, never the wrapped value
  with pytest.raises(TensorError, match="doesn't fit"): m(np.array([2**31 - 1, 0, 0], np.int64), np.array([1, 0, 0], np.int64))


def test_an_int64_cumprod_that_leaves_i32_is_refused_not_wrapped():
  nodes = [helper.make_node("CumProd", ["x", "axis"], ["y"])]
  m = uopc.onnx.load(model_of(nodes, [vi("x", TensorProto.INT64, [4]), vi("axis", TensorProto.INT64, [])], [vi("y", TensorProto.INT64, [4])],
                              opset=26))
  (y,) = m(np.array([2, -3, 4, 5], np.int64), np.array(0, np.int64))
  assert y.dtype == np.int64 and y.tolist() == [2, -6, -24, -120]
  # 3**20 wraps in i32 to a plausible-looking -808182895 after 3**19
  with pytest.raises(TensorError, match="doesn't fit"): m(np.array([3**10, 3**9, 3, 1], np.int64), np.array(0, np.int64))


def test_a_conv_after_a_conv_stores_its_padded_input_once_instead_of_recomputing_it_per_window_position():
  """Conv's pads go to conv2d, which stores the padded input: padded outside it, the pad stayed a view and kernelize
  fused the first conv into every one of the second's 9 window positions (a kernel of 9x the output, 9x the work)."""
  rng = np.random.default_rng(0)
  w1, w2 = (numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), n) for n in ("w1", "w2"))
  nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
           helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]
  proto = model_of(nodes, [vi("x", TensorProto.FLOAT, [1, 4, 6, 6])], [vi("y", TensorProto.FLOAT, [1, 4, 6, 6])], [w1, w2])
  m = uopc.onnx.load(proto, use_jit=False)
  x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
  sizes = [int(np.prod(k.root.shape)) for k in m.run_tensors(x)[0].schedule()]
  assert max(sizes) <= 4 * 8 * 8, sizes   # the padded intermediate (4 channels of 8x8) is the largest thing stored
  want = ReferenceEvaluator(proto).run(None, {"x": x})[0]
  np.testing.assert_allclose(m(x)[0], want, rtol=1e-5, atol=1e-5)


def test_float64_computes_in_f32_and_comes_back_float64():
  nodes = [helper.make_node("Mul", ["a", "a"], ["y"])]
  m = uopc.onnx.load(model_of(nodes, [vi("a", TensorProto.DOUBLE, [2])], [vi("y", TensorProto.DOUBLE, [2])]))
  (y,) = m(np.array([1.5, -3.0]))
  assert y.dtype == np.float64 and y.tolist() == [2.25, 9.0]
  with pytest.raises(OnnxError, match="past f32's range"): m(np.array([1e300, 0.0]))


def test_cast_to_uint8_wraps_and_uint8_arithmetic_wraps():
  nodes = [helper.make_node("Cast", ["x"], ["c"], to=TensorProto.UINT8), helper.make_node("Add", ["c", "c"], ["y"])]
  m = uopc.onnx.load(model_of(nodes, [vi("x", TensorProto.FLOAT, [4])], [vi("c", TensorProto.UINT8, [4]), vi("y", TensorProto.UINT8, [4])]))
  x = np.array([300.7, -1.5, 255.0, 100.0], np.float32)
  c, y = m(x)
  assert c.dtype == np.uint8 and c.tolist() == [44, 255, 255, 100]       # truncated, then modulo 256
  assert y.tolist() == ((c.astype(np.int64) * 2) % 256).tolist()


def test_shape_arithmetic_is_folded_on_the_host():
  # Reshape to (batch * 2, -1) with the shape computed from Shape, Gather, Mul and Concat, as exporters write it
  c = lambda name, v: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.int64)))
  nodes = [helper.make_node("Shape", ["x"], ["s"]), c("zero", 0), c("two", [2]), c("minus1", [-1]),
           helper.make_node("Gather", ["s", "zero"], ["n"]), helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
           helper.make_node("Mul", ["n1", "two"], ["n2"]), helper.make_node("Concat", ["n2", "minus1"], ["shape"], axis=0),
           helper.make_node("Reshape", ["x", "shape"], ["y"])]
  m = uopc.onnx.load(model_of(nodes, [vi("x", TensorProto.FLOAT, ["n", 4])], [vi("y", TensorProto.FLOAT, None)]))
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  (y,) = m(x)
  np.testing.assert_array_equal(y, x.reshape(6, 2))


def test_unsupported_op_and_attribute_name_op_domain_and_version():
  nodes = [helper.make_node("NonMaxSuppression", ["b", "s"], ["y"])]
  with pytest.raises(NotImplementedError, match="op NonMaxSuppression of domain ai.onnx at opset version 21"):
    uopc.onnx.load(model_of(nodes, [vi("b", TensorProto.FLOAT, [1, 1, 4]), vi("s", TensorProto.FLOAT, [1, 1, 1])],
                             [vi("y", TensorProto.INT64, None)]))
  nodes = [helper.make_node("Relu", ["x"], ["y"], bogus=1)]
  with pytest.raises(NotImplementedError, match="Relu.*attribute 'bogus'"):
    uopc.onnx.load(model_of(nodes, [vi("x", TensorProto.FLOAT, [2])], [vi("y", TensorProto.FLOAT, [2])]))
  with pytest.raises(NotImplementedError, match="STRING"):
    uopc.onnx.load(model_of([helper.make_node("Identity", ["x"], ["y"])], [vi("x", TensorProto.STRING, [2])], [vi("y", TensorProto.STRING, [2])]))


def test_a_schema_newer_than_the_reviewed_opset_is_refused(monkeypatch):
  # Relu's schema changed at 14: with the table reviewed only up to 13, a model at 14 must be refused, not run as 13
  from uopc.onnx import registry
  m = model_of([helper.make_node("Relu", ["x"], ["y"])], [vi("x", TensorProto.FLOAT, [2])], [vi("y", TensorProto.FLOAT, [2])], opset=14)
  assert uopc.onnx.load(m)(np.array([-1, 2], np.float32))[0].tolist() == [0, 2]
  monkeypatch.setitem(registry.REVIEWED, "", 13)
  with pytest.raises(NotImplementedError, match="Relu of domain ai.onnx at opset version 14.*schema version 14 is newer than the 13"):
    uopc.onnx.load(m)


def test_ops_dispatch_on_their_opset_version():
  # Softmax before 13 flattens at axis (a softmax over axes 1 and 2 together), from 13 along the one axis
  x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
  out = {}
  for opset in (11, 13):
    m = model_of([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [vi("x", TensorProto.FLOAT, [2, 3, 4])],
                 [vi("y", TensorProto.FLOAT, [2, 3, 4])], opset=opset)
    out[opset] = uopc.onnx.load(m)(x)[0]
  e = np.exp(x - x.max(axis=(1, 2), keepdims=True))
  np.testing.assert_allclose(out[11], e / e.sum(axis=(1, 2), keepdims=True), rtol=1e-5)
  e = np.exp(x - x.max(axis=1, keepdims=True))
  np.testing.assert_allclose(out[13], e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def test_a_served_model_replays_under_jit_after_its_second_call():
  m = uopc.onnx.load(mlp())
  rng = np.random.default_rng(2)
  xs = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(5)]
  plain = uopc.onnx.load(mlp(), use_jit=False)
  for x in xs: np.testing.assert_allclose(m(x)[0], plain(x)[0], rtol=1e-6)
  # the first call plain, then the jit's run and capture: the last two calls built no graph
  assert m.interpreted == 3 and plain.interpreted == 5


def test_data_dependent_shapes_run_plainly_every_call():
  nodes = [helper.make_node("NonZero", ["x"], ["y"])]
  m = uopc.onnx.load(model_of(nodes, [vi("x", TensorProto.FLOAT, [5])], [vi("y", TensorProto.INT64, None)]))
  for x in ([0, 1, 0, 2, 3], [1, 0, 0, 0, 0], [1, 1, 0, 1, 0]):
    (y,) = m(np.array(x, np.float32))
    assert y.dtype == np.int64 and y.tolist() == [list(np.nonzero(x)[0])]


def test_a_gemm_weight_with_transB_is_stored_transposed_once_and_computes_the_same():
  """torch exports Linear as Gemm(transB=1) over an initializer: uopc.onnx keeps a transposed copy of the weight (made
  once per model) and multiplies by it when its outputs fill vectors (a multiple of 8); 6 outputs stay rows, each a
  dot product of two contiguous rows; a weight that is a graph input goes through the transposed view as before."""
  rng = np.random.default_rng(3)
  for n, transposed in [(8, True), (6, False)]:
    w, c = rng.standard_normal((n, 5)).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1, alpha=0.5)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    as_init = uopc.onnx.load(model_of([node], [vi("x", TensorProto.FLOAT, [4, 5])], [vi("y", TensorProto.FLOAT, [4, n])],
                                      [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")]))
    inputs = [vi("x", TensorProto.FLOAT, [4, 5]), vi("w", TensorProto.FLOAT, [n, 5]), vi("c", TensorProto.FLOAT, [n])]
    as_input = uopc.onnx.load(model_of([node], inputs, [vi("y", TensorProto.FLOAT, [4, n])]))
    want = 0.5 * (x @ w.T) + c
    for _ in range(5): np.testing.assert_allclose(as_init(x)[0], want, rtol=1e-5, atol=1e-6)   # plain, capture, replays
    np.testing.assert_allclose(as_input(x, w, c)[0], want, rtol=1e-5, atol=1e-6)
    made = [k for k in as_init.graph.constants if k.startswith("w")]
    assert len(made) == 1 and as_init.graph.constants[made[0]].shape == ((5, n) if transposed else (n, 5))


def test_a_served_model_reads_every_calls_inputs_also_from_threads():
  """Jitted calls copy a NumPy input into a Tensor the model keeps per input signature (no Tensor is made per call):
  every call must see its own data, also when threads call one model at once (the refill and the replay are one step
  under the model's lock), and a Tensor input still goes straight in."""
  import threading
  rng = np.random.default_rng(5)
  w = rng.standard_normal((16, 8)).astype(np.float32)
  node = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)
  m = uopc.onnx.load(model_of([node], [vi("x", TensorProto.FLOAT, [4, 8])], [vi("y", TensorProto.FLOAT, [4, 16])],
                              [numpy_helper.from_array(w, "w")]))
  xs = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(40)]
  for x in xs[:8]: np.testing.assert_allclose(m(x)[0], x @ w.T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(m(Tensor(xs[0]))[0], xs[0] @ w.T, rtol=1e-5, atol=1e-5)
  errors = []
  def serve(part):
    try:
      for x in part: np.testing.assert_allclose(m(x)[0], x @ w.T, rtol=1e-5, atol=1e-5)
    except Exception as e: errors.append(e)
  threads = [threading.Thread(target=serve, args=(xs[k::4],)) for k in range(4)]
  for t in threads: t.start()
  for t in threads: t.join()
  assert not errors, errors[0]
