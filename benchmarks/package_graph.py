"""Which package of emgmm imports which, and the import cycles, read from the source.

    python benchmarks/package_graph.py [TREE]    # TREE: a checkout (default: this one)

Every module under ``TREE/emgmm`` is parsed with :mod:`ast`, nothing is imported, so
any commit can be read (``git worktree add /tmp/old <commit>``). Imports count at any
depth: inside functions and ``if TYPE_CHECKING:`` blocks too. Relative imports are
resolved; a name of the lazy facade of ``emgmm/__init__.py`` (its ``_PUBLIC`` table)
counts as an import of the module that defines it; importing a submodule is an edge
to that submodule, not to its package's ``__init__`` (the convention of
``tests/test_layers.py``). Printed: the package edges (with the number of import
statements behind each), the package cycles and the module cycles (strongly
connected sets of more than one member).
"""

import argparse
import ast
import pathlib
import sys

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components


def modules(tree):
    """``{dotted name: (path, is a package __init__)}`` of every module of emgmm."""
    root = pathlib.Path(tree) / "emgmm"
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def facade(found):
    """``{public name: dotted module}`` from the ``_PUBLIC`` table of emgmm."""
    for node in ast.parse(found["emgmm"][0].read_text()).body:
        if (isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "_PUBLIC" for t in node.targets)):
            return {name: "emgmm" + relative
                    for name, relative in ast.literal_eval(node.value).items()}
    return {}


def owner(found, name):
    """The module of emgmm that the dotted ``name`` (module or attribute) is in."""
    while name not in found:
        name = name.rpartition(".")[0]
    return name


def targets(found, public, module, is_package, node):
    """The modules of emgmm that one ``import`` node of ``module`` imports."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")
            if not is_package:
                parts.pop()
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        names = []
        for alias in node.names:
            full = f"{base}.{alias.name}"
            if base == "emgmm" and alias.name in public:
                names.append(public[alias.name])
            else:
                names.append(full if full in found else base)
    return {owner(found, name) for name in names
            if name == "emgmm" or name.startswith("emgmm.")}


def module_graph(tree):
    """``{module: {imported module: import statements}}`` over the package."""
    found = modules(tree)
    public = facade(found)
    graph = {module: {} for module in found}
    for module, (path, is_package) in found.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in targets(found, public, module, is_package, node):
                    if target != module:
                        graph[module][target] = graph[module].get(target, 0) + 1
    return graph


def package(module):
    """``emgmm`` for the top level, else the subpackage (or ``__main__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "emgmm"


def package_graph(graph):
    edges = {}
    for module, imported in graph.items():
        for target, count in imported.items():
            key = (package(module), package(target))
            if key[0] != key[1]:
                edges[key] = edges.get(key, 0) + count
    return edges


def cycles(graph):
    """The strongly connected sets of more than one node of ``graph`` ({node:
    nodes it imports}), sorted (scipy's strong components)."""
    nodes = sorted(set(graph).union(*graph.values()))
    number = {node: i for i, node in enumerate(nodes)}
    pairs = [(number[a], number[b]) for a, targets in graph.items() for b in targets]
    rows, cols = zip(*pairs, strict=True) if pairs else ((), ())
    adjacency = coo_matrix((np.ones(len(pairs)), (rows, cols)),
                           shape=(len(nodes), len(nodes)))
    _, labels = connected_components(adjacency, directed=True, connection="strong")
    groups = {}
    for node, label in zip(nodes, labels, strict=True):
        groups.setdefault(label, []).append(node)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", nargs="?",
                        default=str(pathlib.Path(__file__).resolve().parents[1]))
    args = parser.parse_args(argv)
    graph = module_graph(args.tree)
    edges = package_graph(graph)
    print(f"{len(graph)} modules, "
          f"{sum(len(t) for t in graph.values())} module edges")
    print("package edges (importer -> imported: import statements):")
    for (source, target), count in sorted(edges.items()):
        print(f"  {source} -> {target}: {count}")
    packages = {}
    for source, target in edges:
        packages.setdefault(source, set()).add(target)
        packages.setdefault(target, set())
    print("package cycles:", cycles(packages) or "none")
    print("module cycles:", "none" if not cycles(graph) else "")
    for members in cycles(graph):
        print("  " + ", ".join(members))
    return 0


if __name__ == "__main__":
    sys.exit(main())
