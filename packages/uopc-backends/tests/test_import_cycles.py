"""No import cycles among uopc's modules: every module of every package under packages/*/src is read with ast, its
imports inside functions included (they run too, just later), and the graph of who imports whom must have no cycle.

A cycle held together by a function-level import works until someone moves the import to the top or calls the function
during import; it also means neither module can be read, tested or replaced without the other. The runtime and the
backends, the C backend and the search, rangeify and gpulower were such pairs: each now imports only modules below it
(a leaf for the compile cache, a base module for what rangeify and gpulower share, the Opts policy passed in)."""
from __future__ import annotations
import ast
from pathlib import Path
import pytest

PACKAGES = Path(__file__).resolve().parents[2]    # packages/: uopc-ir, uopc-lower, uopc-backends, uopc-tensor, ...


def modules(packages: Path = PACKAGES) -> dict[str, Path]:
  """Every module under packages/*/src by its dotted name (a package by its __init__.py)."""
  found = {}
  for path in sorted(packages.glob("*/src/**/*.py")):
    src = next(p for p in path.parents if p.name == "src")
    parts = path.relative_to(src).with_suffix("").parts
    found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
  """The modules of `known` that module `name` imports, anywhere in its file. Importing a.b.c runs a and a.b first, so
  it counts as importing them too, except a package the importer itself lives in: that one is being imported already
  (uopc.tensor.core importing uopc.tensor.errors needs nothing of uopc.tensor's __init__). `from a import b` imports the
  module a.b when there is one, and needs a itself only when b is a name a defines."""
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  own = {".".join(name.split(".")[:k]) for k in range(1, len(name.split(".")))}   # the packages `name` lives in
  named: set[str] = set()
  needed: set[str] = set()      # modules whose own code must have run: named outright, or a name taken from them
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      named.update(a.name for a in node.names)
      needed.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        up = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
      named.add(base)
      named.update(f"{base}.{a.name}" for a in node.names)
      if any(f"{base}.{a.name}" not in known for a in node.names): needed.add(base)
  out = set()
  for m in named:
    parts = m.split(".")
    out.update(prefix for k in range(1, len(parts) + 1) if (prefix := ".".join(parts[:k])) in known and (prefix not in own or prefix in needed))
  out.discard(name)
  return out


def import_graph(packages: Path = PACKAGES) -> dict[str, set[str]]:
  known = modules(packages)
  return {name: imports(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One cycle (a list of modules, the first repeated at the end) for each set of modules that import each other:
  Tarjan's strongly connected components, with an explicit stack, then a shortest way round each."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  on_stack: set[str] = set()
  stack: list[str] = []
  components: list[list[str]] = []
  for root in sorted(graph):
    if root in index: continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = len(index)
    stack.append(root); on_stack.add(root)
    while work:
      v, edges = work[-1]
      w = next(edges, None)
      if w is not None:
        if w not in index:
          index[w] = low[w] = len(index)
          stack.append(w); on_stack.add(w)
          work.append((w, iter(sorted(graph.get(w, ())))))
        elif w in on_stack: low[v] = min(low[v], index[w])
        continue
      work.pop()
      if work: low[work[-1][0]] = min(low[work[-1][0]], low[v])
      if low[v] == index[v]:
        component = []
        while True:
          w = stack.pop(); on_stack.discard(w); component.append(w)
          if w == v: break
        if len(component) > 1: components.append(sorted(component))
  found = []
  for component in components:
    start, inside = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while start not in came_from:          # breadth first from start, back to start, inside the component
      nxt = []
      for v in frontier:
        for w in sorted(graph[v] & inside):
          if w not in came_from: came_from[w] = v; nxt.append(w)
      frontier = nxt
    path, v = [start], came_from[start]
    while v != start: path.append(v); v = came_from[v]
    found.append([start] + path[:0:-1] + [start])
  return found


def test_no_uopc_module_imports_itself_through_others():
  graph = import_graph()
  assert {"uopc.uop", "uopc.rangeify", "uopc.runtime", "uopc.backends", "uopc.backends.c"} <= set(graph)   # it read the tree
  assert "uopc.backends" in graph["uopc.backends.c"] and "uopc.lowering" in graph["uopc.rangeify"]
  found = cycles(graph)
  assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_cycles_are_found_and_named_through_parent_packages_and_function_level_imports(tmp_path):
  src = tmp_path / "pkg" / "src" / "uopc"
  (src / "backends").mkdir(parents=True)
  (src / "backends" / "__init__.py").write_text("def run():\n  from uopc.runtime import go\n")
  (src / "backends" / "c.py").write_text("import math\n")
  (src / "runtime.py").write_text("from uopc.backends.c import x\n")          # runs uopc.backends first
  (src / "leaf.py").write_text("from uopc import runtime\n")
  graph = import_graph(tmp_path)
  assert graph["uopc.runtime"] == {"uopc.backends", "uopc.backends.c"} and graph["uopc.leaf"] == {"uopc.runtime"}
  assert cycles(graph) == [["uopc.backends", "uopc.runtime", "uopc.backends"]]


@pytest.mark.parametrize("graph, expected", [
  ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
  ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c", "a"]]),
  ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b", "a"], ["c", "d", "c"]]),
])
def test_each_set_of_mutually_importing_modules_is_named_once(graph, expected):
  assert sorted(cycles(graph)) == expected
