"""A syntax tree made a module with a source file of its own, as a fork's
module would be, and that file edited after the import: flatgather reads and
proves the source of what it patches."""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path


def module_from_tree(tree: ast.Module, where: Path, name: str) -> types.ModuleType:
    """``tree`` written to ``where/<name>.py`` and executed as module ``name``
    (in ``sys.modules`` while it runs: dataclasses look their module up)."""
    file = where / f"{name}.py"
    file.write_text(ast.unparse(ast.fix_missing_locations(tree)))
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def method_node(tree: ast.Module, owner: str, method: str) -> ast.FunctionDef:
    """``owner.method``'s definition in ``tree``; of the classes of that name,
    the last (the one the module binds)."""
    cls = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner][-1]
    (node,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method]
    return node


def edit_after_import(module: types.ModuleType, owner: str, method: str, edit) -> None:
    """``module``'s source file rewritten with ``owner.method`` changed by
    ``edit``: the file no longer compiles to the code that runs."""
    path = Path(module.__file__)
    tree = ast.parse(path.read_text())
    edit(method_node(tree, owner, method))
    path.write_text(ast.unparse(tree) + "\n# edited after import\n")
