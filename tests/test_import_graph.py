"""The import graph of `dgemma` and `pallas_kernels` has no cycle, and `pallas_kernels` imports nothing from `dgemma`.

The graph is read from the source (every module's AST), so an import inside a function counts as much as one at the
top of a file: a lazy import hides a cycle from Python, not from this test. Edges: `import a.b` -> a.b;
`from a import b` -> a.b where a.b is a module, else -> a; relative imports resolved against the importing module's
package. Importing a.b.c also runs the `__init__` of each package above it that the importer is not itself inside
(a module of package a.b finds a.b already loading), so those packages are edges too.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("dgemma", "pallas_kernels")


def module_files(root: pathlib.Path, packages: tuple[str, ...]) -> dict[str, pathlib.Path]:
  """Dotted module name -> its file, for every .py file under the packages."""
  out = {}
  for package in packages:
    for path in sorted((root / package).rglob("*.py")):
      parts = path.relative_to(root).with_suffix("").parts
      out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return out


def _known(name: str, modules: set[str]) -> str | None:
  """`name` if it is one of the modules, else its longest prefix that is (a.b.attr -> a.b); None if outside."""
  parts = name.split(".")
  for n in range(len(parts), 0, -1):
    if ".".join(parts[:n]) in modules:
      return ".".join(parts[:n])
  return None


def imports_of(name: str, path: pathlib.Path, modules: set[str]) -> set[str]:
  """The modules among `modules` that `name` (the module in `path`) imports anywhere in its source."""
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  targets: set[str | None] = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      targets.update(_known(alias.name, modules) for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base_parts = package.split(".")[:len(package.split(".")) - (node.level - 1)]
        base = ".".join(base_parts + ([node.module] if node.module else []))
      else:
        base = node.module or ""
      for alias in node.names:
        sub = f"{base}.{alias.name}"
        targets.add(sub if sub in modules else _known(base, modules))
  edges = set()
  for target in filter(None, targets):
    parts = target.split(".")
    for above in (".".join(parts[:n]) for n in range(1, len(parts))):  # the packages above the target
      if above in modules and name != above and not name.startswith(above + "."):
        edges.add(above)
    edges.add(target)
  return edges - {name}


def import_graph(root: pathlib.Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
  files = module_files(root, packages)
  return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of the directed graph as [a, b, ..., a], or None if it has none (depth-first search)."""
  done: set[str] = set()
  for start in sorted(graph):
    if start in done:
      continue
    path = [start]
    stack = [iter(sorted(graph.get(start, ())))]
    while stack:
      nxt = next(stack[-1], None)
      if nxt is None:  # every successor of path[-1] explored: it is on no cycle through the path
        done.add(path.pop())
        stack.pop()
      elif nxt in path:
        return path[path.index(nxt):] + [nxt]
      elif nxt not in done:
        path.append(nxt)
        stack.append(iter(sorted(graph.get(nxt, ()))))
  return None


def test_no_import_cycle():
  graph = import_graph()
  assert "dgemma.model.attention" in graph and "pallas_kernels.attention" in graph  # the walk found the packages
  cycle = find_cycle(graph)
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_pallas_kernels_import_nothing_from_dgemma():
  upward = {f"{name} -> {target}" for name, targets in import_graph().items() if name.startswith("pallas_kernels")
            for target in targets if target.split(".")[0] == "dgemma"}
  assert not upward, f"pallas_kernels imports from dgemma: {sorted(upward)}"


def test_find_cycle_on_small_graphs():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) is None
  assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None  # a diamond is no cycle
  assert find_cycle({"a": {"a"}}) == ["a", "a"]
  cycle = find_cycle({"a": {"b"}, "b": {"c"}, "c": {"d", "a"}, "d": set(), "e": {"a"}})
  assert cycle is not None and cycle[0] == cycle[-1]
  assert set(cycle) == {"a", "b", "c"} and len(cycle) == 4
  cycle = find_cycle({"x": {"y"}, "y": set(), "p": {"q"}, "q": {"r"}, "r": {"q"}})
  assert cycle is not None and set(cycle) == {"q", "r"}


def test_graph_sees_function_level_relative_and_submodule_imports(tmp_path):
  pkg = tmp_path / "pkg"
  (pkg / "sub").mkdir(parents=True)
  files = {
      "__init__.py": "",
      "a.py": "import os\n\ndef f():\n  from . import b  # function-level, relative, a submodule\n  return b\n",
      "b.py": "from pkg.sub.c import thing\n",
      "sub/__init__.py": "from .c import thing\n",
      "sub/c.py": "import pkg.a\nthing = 1\n",
      "d.py": "from pkg.a import f\nfrom .sub import thing\n",
  }
  for name, text in files.items():
    (pkg / name).write_text(text)
  graph = import_graph(tmp_path, ("pkg",))
  # (pkg.b -> pkg.sub: importing pkg.sub.c from outside pkg.sub runs pkg/sub/__init__.py first)
  assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub", "pkg.sub.c"}, "pkg.sub": {"pkg.sub.c"},
                   "pkg.sub.c": {"pkg.a"}, "pkg.d": {"pkg.a", "pkg.sub"}}
  assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c", "pkg.a"]
  del graph["pkg.sub.c"]  # the module that closes the cycle
  assert find_cycle(graph) is None
