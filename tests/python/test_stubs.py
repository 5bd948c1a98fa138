"""The type stubs cover packpipe._core: every public name, and every public member of every class,
so the stub cannot fall behind the bindings. They are installed next to the module with py.typed."""
import ast
import inspect
import pathlib

import packpipe
from packpipe import _core

PACKAGE = pathlib.Path(packpipe.__file__).parent
DUNDERS = {"__init__", "__len__", "__iter__", "__next__", "__getitem__", "__enter__", "__exit__", "__eq__",
           "__copy__", "__deepcopy__"}


def stub_names(path):
    """Top-level names of a stub, and the member names of each of its classes."""
    tree = ast.parse(path.read_text())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            top.add(node.target.id)
        elif isinstance(node, ast.Assign):
            top.update(t.id for t in node.targets)
        if isinstance(node, ast.ClassDef):
            members[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)} | \
                {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
    return top, members


def public(obj):
    return {n for n in dir(obj) if not n.startswith("_")}


def test_stubs_and_marker_are_installed_next_to_the_module():
    assert (PACKAGE / "py.typed").is_file()
    assert (PACKAGE / "_core.pyi").is_file() and (PACKAGE / "__init__.pyi").is_file()
    assert "from packpipe._core import *" in (PACKAGE / "__init__.pyi").read_text()


def test_stub_lists_every_public_name_of_the_core():
    top, members = stub_names(PACKAGE / "_core.pyi")
    missing = (public(_core) | {"__version__"}) - top
    assert not missing, f"not in _core.pyi: {sorted(missing)}"
    extra = {n for n in top - public(_core) if not n.startswith("_")}
    assert not extra, f"in _core.pyi but not in packpipe._core: {sorted(extra)}"
    for name in sorted(public(_core)):
        cls = getattr(_core, name)
        if not inspect.isclass(cls):
            continue
        own = {n for n in vars(cls) if not n.startswith("_") or n in DUNDERS}
        if "Initialize self" in (cls.__init__.__doc__ or ""):
            own.discard("__init__")  # no constructor bound (a result class): none in the stub either
        missing = own - members[name]
        assert not missing, f"{name}: not in _core.pyi: {sorted(missing)}"
        stale = {n for n in members[name] if not n.startswith("_")} - public(cls)
        assert not stale, f"{name}: in _core.pyi but not bound: {sorted(stale)}"


def test_every_stub_entry_has_a_one_line_doc():
    tree = ast.parse((PACKAGE / "_core.pyi").read_text())
    undocumented = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not ast.get_docstring(node):
            undocumented.append(node.name)
    assert not undocumented, undocumented
