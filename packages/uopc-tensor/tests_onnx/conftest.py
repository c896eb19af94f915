"""The pass rate of ONNX's node tests, printed at the end of a run of all of them (UOPC_ONNX_NODE_TESTS=all): passed
over the 1,884 node tests of onnx 1.23.2, excluded ones counting as not passed."""
import os


def pytest_terminal_summary(terminalreporter, exitstatus, config):
  if os.environ.get("UOPC_ONNX_NODE_TESTS") != "all": return
  from onnx.backend.test.loader import load_model_tests
  passed = sum(1 for r in terminalreporter.stats.get("passed", []) if "OnnxBackendNodeModelTest" in r.nodeid)
  total = len(load_model_tests(kind="node"))
  terminalreporter.write_line(f"ONNX node tests: {passed} of {total} pass ({100 * passed / total:.1f}%)", bold=True)
