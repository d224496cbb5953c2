"""The layers of the package hold: no import from a higher layer, no import cycle.

Every module of ``emgmm`` is parsed with :mod:`ast`; its imports at any depth count
(inside functions and ``if TYPE_CHECKING:`` blocks too), relative imports resolved,
and a name served by the lazy facade of ``emgmm/__init__.py`` (``from emgmm import
GaussianMixture``) counts as an import of the module that defines it. Importing a
submodule is an edge to that submodule only, not to the ``__init__`` of its package
(which Python runs first): the ``__init__`` modules that gather their submodules'
names would otherwise always close a cycle.
"""

import ast
import importlib.util
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "emgmm"


def _package_graph_script():
    """benchmarks/package_graph.py, whose cycle finder this test shares."""
    path = PACKAGE.parent / "benchmarks" / "package_graph.py"
    spec = importlib.util.spec_from_file_location("package_graph", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


_cycles = _package_graph_script().cycles

#: The layers, lowest first: a module imports only from its own layer and those
#: below. ``""`` is ``emgmm/__init__.py`` (``__version__`` and the facade, which
#: imports nothing itself); ``__main__`` runs the command line.
LAYERS = ("", "_runtime", "covariance", "_engine", "_io", "_mixture",
          "_cli", "__main__")


def _modules():
    """``{dotted name: (path, is a package __init__)}`` of every module of emgmm."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        modules[".".join(parts)] = (path, is_package)
    return modules


MODULES = _modules()


def _facade():
    """``{public name: dotted module}`` of the ``_PUBLIC`` table of emgmm/__init__."""
    tree = ast.parse(MODULES["emgmm"][0].read_text())
    for node in tree.body:
        if (isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "_PUBLIC" for t in node.targets)):
            return {name: "emgmm" + relative
                    for name, relative in ast.literal_eval(node.value).items()}
    return {}


FACADE = _facade()


def _owner(name):
    """The module of the package that a dotted ``name`` (module or attribute) is in."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _targets(module, is_package, node):
    """The modules of emgmm that an ``import`` node of ``module`` imports."""
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
            if base == "emgmm" and alias.name in FACADE:
                names.append(FACADE[alias.name])
            else:
                names.append(full if full in MODULES else base)
    return [_owner(name) for name in names
            if name == "emgmm" or name.startswith("emgmm.")]


def _imports():
    """``[(module, line, imported module, statement)]`` over the whole package."""
    found = []
    for module, (path, is_package) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [(module, node.lineno, target, ast.unparse(node))
                          for target in dict.fromkeys(
                              _targets(module, is_package, node))
                          if target != module]
    return found


IMPORTS = _imports()


def _layer(module):
    parts = module.split(".")
    return LAYERS.index(parts[1] if len(parts) > 1 else "")


def _path(module):
    return MODULES[module][0].relative_to(PACKAGE.parent)


def test_every_module_is_in_a_layer():
    unknown = sorted({m.split(".")[1] for m in MODULES if "." in m} - set(LAYERS))
    assert not unknown, f"subpackages without a layer in LAYERS: {unknown}"


def test_no_import_from_a_higher_layer():
    upward = [f"{_path(m)}:{line}: {statement!r} imports {t} ({LAYERS[_layer(t)]} "
              f"is above {LAYERS[_layer(m)] or 'emgmm'})"
              for m, line, t, statement in IMPORTS if _layer(t) > _layer(m)]
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_cycles_finds_the_strongly_connected_sets():
    """The cycle finder itself (so that test_no_import_cycle can fail)."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"},
             "f": set()}
    assert _cycles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    graph = {module: set() for module in MODULES}
    where = {}
    for module, line, target, _ in IMPORTS:
        graph[module].add(target)
        where.setdefault((module, target), line)
    described = []
    for members in _cycles({m: sorted(t) for m, t in graph.items()}):
        edges = [f"  {_path(m)}:{where[m, t]} imports {t}"
                 for m in members for t in sorted(graph[m]) if t in members]
        described.append(", ".join(members) + ":\n" + "\n".join(edges))
    assert not described, "import cycles:\n" + "\n".join(described)


@pytest.mark.parametrize(("source", "module", "expected"), [
    ("from . import memory", "emgmm._runtime.worker_loss", "emgmm._runtime.memory"),
    ("from .. import __version__", "emgmm._io.model_file", "emgmm"),
    ("from .. import GaussianMixture", "emgmm._cli.command",
     "emgmm._mixture.gaussian_mixture"),
    ("from ..covariance import REGISTRY", "emgmm._engine.online", "emgmm.covariance"),
    ("import emgmm._runtime.blas as blas", "emgmm._mixture.base",
     "emgmm._runtime.blas"),
    ("def f():\n    from ._log_density import chunk_rows", "emgmm.covariance._base",
     "emgmm.covariance._log_density"),
])
def test_imports_are_resolved(source, module, expected):
    """The resolution the checks rely on, on the forms the package uses."""
    node = next(n for n in ast.walk(ast.parse(source))
                if isinstance(n, (ast.Import, ast.ImportFrom)))
    assert _targets(module, MODULES[module][1], node) == [expected]


def test_the_module_map_of_contributing_names_every_module():
    """CONTRIBUTING.md's map of the tree names each module of the package."""
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    section = text[text.index("## Where things live"):]
    missing = [str(path.relative_to(PACKAGE))
               for path in sorted(PACKAGE.rglob("*.py"))
               if path.name != "__init__.py" and path.name not in section]
    assert not missing, missing


def test_the_test_map_of_contributing_names_every_test_module():
    """CONTRIBUTING.md's map of the tests names each test module, and no other."""
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    section = text[text.index("### Where the tests live"):text.index("## Lint")]
    named = set(re.findall(r"\btest_\w+\.py\b", section))
    present = {path.name for path in (PACKAGE.parent / "tests").glob("test_*.py")}
    assert named == present, (sorted(present - named), sorted(named - present))


def test_the_layout_of_the_design_notes_places_modules_where_they_are():
    """docs/design.rst's layout block names only modules that exist, each under the
    package (``name/`` line) it is listed in."""
    text = (PACKAGE.parent / "docs" / "design.rst").read_text()
    block = text[text.index("   emgmm/\n"):]
    block = block[:block.index("\n\n")]
    package, misplaced = PACKAGE, []
    for line in block.splitlines()[1:]:
        head = line.split()[0] if line.split() else ""
        if head.endswith("/") and line.startswith("     ") and line[5] != " ":
            package = PACKAGE / head.rstrip("/")
        for name in re.findall(r"\b\w+\.py\b", line):
            if not (package / name).is_file() and not (PACKAGE / name).is_file():
                misplaced.append(f"{package.name}/{name}")
    assert not misplaced, misplaced


#: Modules of other projects whose private names (``_x``) the package must not use.
THIRD_PARTY = ("joblib", "sklearn", "threadpoolctl", "numpy", "scipy", "h5py")


def _private_uses(tree):
    """``module._name`` reads and ``from module._x import`` of :data:`THIRD_PARTY`
    modules in ``tree`` (names bound by its imports at any depth)."""
    def private(dotted):
        return any(part.startswith("_") and not part.startswith("__")
                   for part in dotted.split("."))

    def foreign(dotted):
        return dotted.split(".")[0] in THIRD_PARTY

    bound, uses = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if foreign(alias.name):
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and foreign(
                node.module or ""):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                if private(name):
                    uses.append(name)
                bound[alias.asname or alias.name] = name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in bound and private(node.attr)):
            uses.append(f"{bound[node.value.id]}.{node.attr}")
    return uses


def test_no_private_name_of_another_project():
    """Only public API of joblib, scikit-learn and the rest: their private names
    change without notice (``joblib.parallel._backend`` was read for the temporary
    folder)."""
    found = {module: uses for module, (path, _) in MODULES.items()
             if (uses := _private_uses(ast.parse(path.read_text())))}
    assert not found, found
    assert _private_uses(ast.parse(
        "from joblib import parallel as _jp\nx = _jp._backend")) == [
        "joblib.parallel._backend"]


#: Private names of the standard library that its documentation gives as API.
DOCUMENTED_PRIVATE = {"_exit"}  # os._exit


def _foreign_private_attributes(trees):
    """``obj._name`` reads and ``getattr(obj, "_name")`` / ``hasattr`` of a ``_name``
    that no module of ``trees`` defines (as a function, class, variable, attribute,
    argument or import): another project's private state, whatever the object is
    named (a memmap's ``mm._mmap`` was read to tell a view from its map)."""
    def private(name):
        return name.startswith("_") and not name.startswith("__")

    defined = set(DOCUMENTED_PRIVATE)
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Name | ast.Attribute) and isinstance(
                    node.ctx, ast.Store):
                defined.add(node.id if isinstance(node, ast.Name) else node.attr)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, ast.alias):
                defined.add((node.asname or node.name).split(".")[0])
    found = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif (isinstance(node, ast.Call)
                  and getattr(node.func, "id", None) in ("getattr", "hasattr")
                  and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str)):
                name = node.args[1].value
            if name and private(name) and name not in defined:
                found.append(f"{module}:{node.lineno}: {name}")
    return found


def test_no_private_attribute_of_another_project():
    """A private attribute read from an object of another project (numpy's memmaps,
    h5py's datasets, joblib's backends) is caught by its name, which emgmm does not
    define."""
    trees = {module: ast.parse(path.read_text())
             for module, (path, _) in MODULES.items()}
    found = _foreign_private_attributes(trees)
    assert not found, found
    assert _foreign_private_attributes({"m": ast.parse(
        "def f(mm):\n    return mm.base is getattr(mm, '_mmap', None)")}) == [
        "m:2: _mmap"]


#: Lines of code (not docstrings, comments or blank lines) a function may take.
MAX_FUNCTION_LINES = 60


def _code_lines(node, lines):
    """Lines of code of the function ``node`` (its docstring, comments and blank
    lines left out)."""
    body = node.body
    first = body[0]
    has_doc = (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
               and isinstance(first.value.value, str))
    start = first.end_lineno if has_doc else node.lineno
    return [line for line in lines[start:node.end_lineno]
            if line.strip() and not line.strip().startswith("#")]


def _only_stores_parameters(node):
    """An ``__init__`` that only stores its parameters (scikit-learn's estimators:
    one line per parameter)."""
    return node.name == "__init__" and all(
        isinstance(stmt, ast.Assign) or (isinstance(stmt, ast.Expr)
                                         and isinstance(stmt.value, ast.Constant))
        for stmt in node.body)


def test_no_function_is_longer_than_sixty_lines_of_code():
    """Functions short enough to read at once (branches are held to 15 by ruff's
    PLR0912 and C901, configured in pyproject.toml)."""
    long = []
    for module, (path, _) in MODULES.items():
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                    and not _only_stores_parameters(node)
                    and len(_code_lines(node, lines)) > MAX_FUNCTION_LINES):
                long.append(f"{module}.{node.name}")
    assert not long, long
    sample = "def f():\n    '''doc'''\n" + "    x = 1\n" * 61
    assert len(_code_lines(ast.parse(sample).body[0], sample.splitlines())) == 61


#: The modules a user imports; every other module has a private name
#: (``emgmm._engine.em``, ``emgmm.covariance._base``), as scikit-learn's
#: ``sklearn/mixture/_base.py``, so that only what these export is public API.
PUBLIC_MODULES = {"emgmm", "emgmm.__main__", "emgmm.covariance"}


def _is_private(module):
    return any(part.startswith("_") and not part.startswith("__")
               for part in module.split("."))


def test_internal_modules_are_private():
    public = sorted(m for m in MODULES
                    if m not in PUBLIC_MODULES and not _is_private(m))
    assert not public, f"modules with a public name outside PUBLIC_MODULES: {public}"
    assert _is_private("emgmm._engine.em") and not _is_private("emgmm.engine.em")


def test_the_public_modules_export_only_what_they_define_or_gather():
    """Each public module lists its API in ``__all__``, and every name of it
    resolves (the facade's imports included)."""
    import importlib

    for module in sorted(PUBLIC_MODULES - {"emgmm.__main__"}):
        imported = importlib.import_module(module)
        missing = [name for name in imported.__all__ if not hasattr(imported, name)]
        assert not missing, (module, missing)


def _emgmm_aliases(tree):
    """``{local name: dotted emgmm name}`` bound by the imports of ``tree`` (any
    depth): modules, and classes or functions imported from them."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "emgmm" and alias.asname:
                    aliases[alias.asname] = alias.name
        elif (isinstance(node, ast.ImportFrom) and node.level == 0
              and (node.module or "").split(".")[0] == "emgmm"):
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _patched_functions(tree):
    """``[(line, emgmm object, attribute)]`` of the ``*.setattr(obj, "name", ...)``
    calls of ``tree`` on an object of emgmm that replace a function (not an
    upper-case module constant)."""
    aliases, found = _emgmm_aliases(tree), []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "setattr" and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)):
            continue
        root = node.args[0]
        while isinstance(root, ast.Attribute):
            root = root.value
        name = node.args[1].value
        if (isinstance(root, ast.Name) and root.id in aliases
                and not name.lstrip("_").isupper()):
            found.append((node.lineno, ast.unparse(node.args[0]), name))
    return found


def test_contributing_lists_every_patched_function_of_emgmm():
    """A test that replaces one of emgmm's functions (a spy, a tripwire, a failure
    or a platform) is in CONTRIBUTING.md's list of the patches that remain: a new
    one is a seam to add first, or a reason to give there."""
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    section = text[text.index("The patches of emgmm's own functions"):
                   text.index("### Where the tests live")]
    unlisted = [f"{path.name}:{line}: {target}.{name}"
                for path in sorted((PACKAGE.parent / "tests").glob("test_*.py"))
                for line, target, name in _patched_functions(
                    ast.parse(path.read_text()))
                if f"{name}`" not in section]
    assert not unlisted, unlisted
    assert _patched_functions(ast.parse(
        "from emgmm._engine import estep as e\n"
        "def test(monkeypatch):\n"
        "    monkeypatch.setattr(e, 'log_prob', None)\n"
        "    monkeypatch.setattr(e, 'CHUNK', 1)\n")) == [(3, "e", "log_prob")]
