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


def check_stub(module, stub):
    top, members = stub_names(stub)
    missing = (public(module) | ({"__version__"} if module is _core else set())) - top
    assert not missing, f"not in {stub.name}: {sorted(missing)}"
    extra = {n for n in top - public(module) if not n.startswith("_")}
    assert not extra, f"in {stub.name} but not in {module.__name__}: {sorted(extra)}"
    for name in sorted(public(module)):
        cls = getattr(module, name)
        if not inspect.isclass(cls) or issubclass(cls, BaseException):
            continue
        own = {n for n in vars(cls) if not n.startswith("_") or n in DUNDERS}
        if "Initialize self" in (cls.__init__.__doc__ or ""):
            own.discard("__init__")  # no constructor bound (a result class): none in the stub either
        missing = own - members[name]
        assert not missing, f"{name}: not in {stub.name}: {sorted(missing)}"
        stale = {n for n in members[name] if not n.startswith("_")} - public(cls)
        assert not stale, f"{name}: in {stub.name} but not bound: {sorted(stale)}"


def test_stub_lists_every_public_name_of_the_core():
    check_stub(_core, PACKAGE / "_core.pyi")


def test_runtime_stub_lists_every_name_of_the_executor_module():
    import packpipe.runtime
    check_stub(_core._runtime, PACKAGE / "runtime.pyi")
    assert set(packpipe.runtime.__all__) == public(_core._runtime)


def test_every_stub_entry_has_a_one_line_doc():
    undocumented = []
    for stub in ("_core.pyi", "runtime.pyi"):
        undocumented += undocumented_entries(PACKAGE / stub)
    assert not undocumented, undocumented


def undocumented_entries(path):
    tree = ast.parse(path.read_text())
    undocumented = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not ast.get_docstring(node):
            undocumented.append(f"{path.name}: {node.name}")
    return undocumented
