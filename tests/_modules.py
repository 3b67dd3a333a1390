"""A syntax tree made a module with a source file of its own, as a fork's
module would be: flatgather reads and proves the source of what it patches."""

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
