"""The running release's own source, read and rebuilt with care.

Every patch that rewrites or fingerprints SGLang code starts here: the draft
worker's prefill (its rotation loop replaced), the scheduler's prefill
results (an advance inserted in the skip branch), the output-logprob chain
(its host-copy and ``tolist`` loops replaced), and the known-code check of
the functions replaced whole (:mod:`flatgather.sglang.shapes`).
:func:`parse_method` and :func:`parse_function` prove that the source they
parsed is the code that runs: the parsed ``def``, compiled as it was (inside
a class of the same name for a method, at the same line, after the module's
imports, with its ``__future__`` flags), must give a code object equal to the
function's own. A source file edited after import, a function replaced at run
time or a compiled build all fail that check, and the caller leaves the code
stock.

:func:`build_method` compiles a rewritten ``def`` into a function that shares
the original's globals, defaults and names, and whose line numbers are the
release's, so tracebacks point into the release's file. It compiles with
:func:`compile_def`, the one place a rewritten ``def`` is compiled in the
release's context (its class, its file, its ``__future__`` flags), which the
draft worker's check (:mod:`flatgather.sglang.patches.draft_prefill.check`) uses for the
blocks it runs side by side.
"""

from __future__ import annotations
import __future__

import ast
import functools
import linecache
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "Method",
    "SourceMismatch",
    "build_method",
    "compile_def",
    "forget_parses",
    "module_tree",
    "parse_function",
    "parse_method",
    "parse_undecorated_method",
]

_FUTURE_MASK = 0
for _name in __future__.all_feature_names:
    _FUTURE_MASK |= getattr(__future__, _name).compiler_flag

_FACTORY = "__flatgather_factory__"


class SourceMismatch(Exception):
    """The source found for a function is not the code that runs."""


@dataclass(frozen=True)
class Method:
    """A method of a class and the verified syntax tree of its source."""

    owner: type
    name: str
    function: types.FunctionType
    tree: ast.FunctionDef
    filename: str
    imports: list[ast.stmt]
    """The module's top-level statements that import names."""


def _node(cls: type[ast.AST], **fields) -> ast.AST:
    """``cls(**fields)`` without the fields this Python's AST lacks
    (``type_params`` arrived in 3.12)."""
    return cls(**{k: v for k, v in fields.items() if k in cls._fields})


def _class_module(imports: list[ast.stmt], owner_name: str, tree: ast.FunctionDef) -> ast.Module:
    cls = _node(
        ast.ClassDef,
        name=owner_name,
        bases=[],
        keywords=[],
        body=[tree],
        decorator_list=[],
        type_params=[],
    )
    ast.copy_location(cls, tree)
    return ast.fix_missing_locations(ast.Module(body=[*imports, cls], type_ignores=[]))


def _find_code(code: types.CodeType, name: str) -> types.CodeType | None:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name:
                return const
            found = _find_code(const, name)
            if found is not None:
                return found
    return None


def _compile(module: ast.Module, function: types.FunctionType) -> types.CodeType:
    flags = function.__code__.co_flags & _FUTURE_MASK
    return compile(module, function.__code__.co_filename, "exec", flags=flags, dont_inherit=True)


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _binds_imports(stmt: ast.stmt) -> bool:
    """Whether ``stmt`` imports a name into the module's namespace: an
    import at the top, or inside an ``if`` / ``try`` there. An import inside
    a function or class binds a name of that scope only, so those bodies are
    not searched (nor compiled along with the method: they can be large)."""
    todo = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return True
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return False


def _lines(filename: str, module_globals) -> list[str]:
    # checkcache drops a cached copy whose file changed since it was read.
    linecache.checkcache(filename)
    return linecache.getlines(filename, module_globals)


@functools.lru_cache(maxsize=16)
def _parse(text: str, filename: str) -> ast.Module:
    """Parsed once per text: several methods of one file (a method and its
    helpers) share a parse. Callers never change the tree they get (they
    rewrite a deep copy). Room for every file one install step reads (up to
    ten: the logits and logprob processors, the worker, the scheduler's
    result processor, the batch result's module, the copy helper's, ...);
    emptied when the step is done (:func:`forget_parses`)."""
    return ast.parse(text, filename)


def forget_parses() -> None:
    """Drop the parsed files. A parsed file of SGLang's size is some ten
    thousand syntax-tree objects that the garbage collector walks in every
    full collection for as long as they live: the installer drops them once
    a step of the install is done (:mod:`flatgather.sglang.installer`), so
    a server's processes keep none of them."""
    _parse.cache_clear()


def module_tree(module: types.ModuleType) -> ast.Module | None:
    """The syntax tree of ``module``'s source file as it reads now, or None
    when it has none that parses. Shared: not to be changed."""
    filename = getattr(module, "__file__", None)
    lines = _lines(filename, vars(module)) if filename else []
    try:
        return _parse("".join(lines), filename) if lines else None
    except SyntaxError:
        return None


def _plain(function, where: str) -> None:
    if not isinstance(function, types.FunctionType):
        raise SourceMismatch(f"{where} is not a plain function")
    if function.__code__.co_freevars:
        raise SourceMismatch(f"{where} is a closure")


def _source_of(function: types.FunctionType, where: str) -> tuple[ast.Module, str]:
    """The parsed source file of ``function`` and its name."""
    filename = function.__code__.co_filename
    lines = _lines(filename, function.__globals__)
    if not lines:
        raise SourceMismatch(f"no source for {where} ({filename})")
    try:
        return _parse("".join(lines), filename), filename
    except SyntaxError as exc:
        raise SourceMismatch(f"the source of {where} does not parse: {exc}") from None


def _prove(module: ast.Module, function: types.FunctionType, where: str, filename: str) -> None:
    """``module`` (the source's imports and the ``def``), compiled, must
    hold ``function``'s own code object."""
    code = _find_code(_compile(module, function), function.__name__)
    if code is None or code != function.__code__:
        raise SourceMismatch(
            f"the source of {where} in {filename} does not compile to the code that runs "
            "(edited after import, or replaced at run time)"
        )


def parse_method(owner: type, name: str, decorated: bool = False) -> Method:
    """The verified syntax tree of ``owner.<name>`` (a plain function in the
    ``__dict__`` of a class defined at the top of its module). Raises
    :class:`SourceMismatch` when the source cannot be found or does not
    compile to the running code.

    With ``decorated``, the attribute may be what the source's decorators
    made of the function (a wrapper whose ``__wrapped__`` is it, as
    ``torch.profiler.record_function`` makes): the function under it is the
    one proven, and the source must have decorators."""
    where = f"{owner.__qualname__}.{name}"
    function = vars(owner).get(name)
    wrapped = getattr(function, "__wrapped__", None)
    if decorated and isinstance(wrapped, types.FunctionType) and function is not wrapped:
        function = wrapped
    else:
        decorated = False
    _plain(function, where)
    if owner.__qualname__ != owner.__name__:
        raise SourceMismatch(f"{owner.__qualname__} is not defined at the top of its module")
    module, filename = _source_of(function, where)
    classes = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == owner.__name__]
    defs = [
        n for c in classes[-1:] for n in c.body if isinstance(n, ast.FunctionDef) and n.name == name
    ]
    if not defs:
        raise SourceMismatch(f"{where} is not in {filename}")
    # Which names the module imports changes the bytecode of calls on them
    # (CPython does not use LOAD_METHOD on an imported module), so the
    # module's imports are compiled along with the method.
    imports = [stmt for stmt in module.body if _binds_imports(stmt)]
    tree = defs[-1]
    if decorated and not tree.decorator_list:
        raise SourceMismatch(f"{where} is wrapped, but its source has no decorator")
    _prove(_class_module(imports, owner.__name__, tree), function, where, filename)
    return Method(owner, name, function, tree, filename, imports)


def parse_undecorated_method(owner: type, name: str) -> Method:
    """:func:`parse_method`, for a patch that rebuilds the method from its
    tree: the rebuilt function is not decorated again, so a method whose
    source has decorators is refused (:class:`SourceMismatch`)."""
    method = parse_method(owner, name)
    if method.tree.decorator_list:
        raise SourceMismatch(f"{owner.__qualname__}.{name} is decorated")
    return method


def parse_function(function: types.FunctionType) -> ast.FunctionDef:
    """The verified syntax tree of a function defined at the top of its
    module, as :func:`parse_method` verifies a method's: its source,
    compiled after the module's imports, must give its own code object.
    Raises :class:`SourceMismatch` otherwise."""
    where = getattr(function, "__qualname__", repr(function))
    _plain(function, where)
    if function.__qualname__ != function.__name__:
        raise SourceMismatch(f"{where} is not defined at the top of its module")
    module, filename = _source_of(function, where)
    name = function.__name__
    defs = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not defs:
        raise SourceMismatch(f"{where} is not in {filename}")
    imports = [stmt for stmt in module.body if _binds_imports(stmt)]
    tree = defs[-1]
    body = ast.fix_missing_locations(ast.Module(body=[*imports, tree], type_ignores=[]))
    _prove(body, function, where, filename)
    return tree


def compile_def(
    method: Method,
    tree: ast.FunctionDef,
    closure: Mapping[str, object],
    imports: Sequence[ast.stmt] = (),
):
    """Compile ``tree``, a ``def`` named as ``method``, where the release
    compiled ``method``: inside a class of the owner's name (the same
    mangling of private names), after ``imports``, in the method's file with
    its module's ``__future__`` flags. The function reads ``closure``'s names
    as free variables and the module's globals as the original does; nothing
    is added to the module's namespace. Returns what the class body binds to
    the name: the function, or what the tree's decorators (evaluated in the
    module's globals) made of it."""
    params = ast.arguments(
        posonlyargs=[],
        args=[ast.arg(arg=n) for n in closure],
        kwonlyargs=[],
        kw_defaults=[],
        defaults=[],
    )
    cls = _class_module([], method.owner.__name__, tree).body[0]
    factory = _node(
        ast.FunctionDef,
        name=_FACTORY,
        args=params,
        body=[
            cls,
            ast.Return(
                ast.Subscript(
                    value=ast.Call(
                        func=ast.Name("vars", ast.Load()),
                        args=[ast.Name(method.owner.__name__, ast.Load())],
                        keywords=[],
                    ),
                    slice=ast.Constant(method.name),
                    ctx=ast.Load(),
                )
            ),
        ],
        decorator_list=[],
        returns=None,
        type_params=[],
    )
    ast.copy_location(factory, tree)
    module = ast.fix_missing_locations(ast.Module(body=[*imports, factory], type_ignores=[]))
    code = _find_code(_compile(module, method.function), _FACTORY)
    assert code is not None
    make = types.FunctionType(code, method.function.__globals__, _FACTORY)
    return make(*closure.values())


def build_method(
    method: Method, tree: ast.FunctionDef, closure: Mapping[str, object]
) -> types.FunctionType:
    """Compile ``tree`` (a rewritten copy of ``method.tree``) with
    :func:`compile_def`, after the module's imports (as :func:`parse_method`
    compiles, so that the bytecode is the release's), into a function that
    reads ``closure``'s names as free variables. The tree's decorators are
    applied as the class body applies them; the function under them gets the
    original's defaults and names."""
    built = compile_def(method, tree, closure, method.imports)
    outer = built
    if tree.decorator_list:
        built = getattr(outer, "__wrapped__", None)
        if not isinstance(built, types.FunctionType):
            raise SourceMismatch(f"{method.name}: its decorators do not keep __wrapped__")
    original = method.function
    built.__defaults__ = original.__defaults__
    built.__kwdefaults__ = original.__kwdefaults__
    built.__qualname__ = original.__qualname__
    built.__module__ = original.__module__
    built.__doc__ = original.__doc__
    built.__dict__.update(original.__dict__)
    built.__wrapped__ = original
    if outer is not built:
        outer.__qualname__ = original.__qualname__
        outer.__module__ = original.__module__
    outer.__flatgather_build__ = Build(method, tree, dict(closure))
    return outer


@dataclass(frozen=True)
class Build:
    """What :func:`build_method` built a method from: the release's method
    (its source proven), the rewritten tree and the free variables."""

    method: Method
    tree: ast.FunctionDef
    closure: dict[str, object]


def to_rewrite(owner: type, name: str, decorated: bool = False) -> Build:
    """What a rewrite of ``owner.<name>`` starts from: the release's method,
    its tree and no free variables; or, where flatgather has already rebuilt
    the attribute (two fixes in one method, as ``process_batch_result_prefill``
    up to 0.5.12), that build, so that a second rewrite adds to the first
    instead of refusing the wrapped function. Raises :class:`SourceMismatch`
    as :func:`parse_method` does."""
    build = getattr(vars(owner).get(name), "__flatgather_build__", None)
    if isinstance(build, Build):
        return build
    method = parse_method(owner, name, decorated)
    return Build(method, method.tree, {})
