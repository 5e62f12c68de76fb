"""Every error code the code can answer with, found by reading its source.

A code is a string constant given as an error's `code`: a `code=` argument, a `code`
class attribute, a `"code"` key of a dict, a value assigned to a variable named `code`,
or the first argument of a class of the same module whose `__init__` takes `code` first.
Where the code is given to one of inferq's exceptions, the exception's class says the
HTTP status it is answered with (api/errors.py).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("inferq", "api", "worker", "housekeeper", "cli")


@functools.cache
def raised_codes(root: Path = ROOT) -> dict[str, set[str]]:
    """Each code, and the names of the classes (or callables) it is given to."""
    found: dict[str, set[str]] = {}
    for path in _sources(root):
        visitor = _CodeFinder(ast.parse(path.read_text()))
        for code, context in visitor.found:
            found.setdefault(code, set()).add(context)
    return found


def http_statuses(found: dict[str, set[str]], root: Path = ROOT) -> dict[str, set[int]]:
    """Each code's HTTP statuses, where it is given to one of inferq's exceptions."""
    from api.errors import mapped_status
    from inferq import exceptions

    bases = _class_bases(root)

    def known(name: str, seen: frozenset[str] = frozenset()) -> set[type[Exception]]:
        """inferq's exceptions among the class of this name and its ancestors."""
        found = getattr(exceptions, name, None)
        if isinstance(found, type) and issubclass(found, exceptions.InferqError):
            return {found}
        parents = [p for p in bases.get(name, []) if p not in seen]
        return set().union(*(known(p, seen | {name}) for p in parents))

    statuses: dict[str, set[int]] = {}
    for code, contexts in found.items():
        for cls in set().union(*(known(context) for context in contexts)):
            if (mapped := mapped_status(cls)) is not None:
                statuses.setdefault(code, set()).add(mapped[0])
    return statuses


def _sources(root: Path) -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((root / package).rglob("*.py"))


def _class_bases(root: Path) -> dict[str, list[str]]:
    """Each class of the packages, and the names of its bases."""
    bases: dict[str, list[str]] = {}
    for path in _sources(root):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [_name(b) for b in node.bases]
    return bases


class _CodeFinder(ast.NodeVisitor):
    def __init__(self, module: ast.Module) -> None:
        self.found: list[tuple[str, str]] = []
        self._classes: list[str] = []
        self._takes_code_first = _takes_code_first(module)
        self.visit(module)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for statement in node.body:
            if isinstance(statement, ast.Assign | ast.AnnAssign) and _names_code(statement):
                self._add(_constants(statement.value), node.name)
        self._classes.append(node.name)
        self.generic_visit(node)
        self._classes.pop()

    def visit_Call(self, node: ast.Call) -> None:
        name = _name(node.func)
        if name == "__init__" and self._classes:  # super().__init__(code=...)
            name = self._classes[-1]
        for keyword in node.keywords:
            if keyword.arg == "code":
                self._add(_constants(keyword.value), name)
        if name in self._takes_code_first and node.args:
            self._add(_constants(node.args[0]), name)
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        for key, value in zip(node.keys, node.values, strict=True):
            if isinstance(key, ast.Constant) and key.value == "code":
                self._add(_constants(value), "dict")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for statement in ast.walk(node):
            if isinstance(statement, ast.Assign):
                for target in statement.targets:
                    self._add(_assigned_to_code(target, statement.value), "code")
        self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        for statement in ast.walk(node):
            if isinstance(statement, ast.Assign):
                for target in statement.targets:
                    self._add(_assigned_to_code(target, statement.value), "code")
        self.generic_visit(node)

    def _add(self, codes: Iterator[str], context: str) -> None:
        self.found.extend((code, context) for code in codes)


def _takes_code_first(module: ast.Module) -> set[str]:
    """Names of the module's classes whose `__init__` takes `code` first."""
    names = set()
    for node in ast.walk(module):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                first = [a.arg for a in item.args.args[1:2]] if _is_init(item) else []
                if first == ["code"]:
                    names.add(node.name)
    return names


def _is_init(item: ast.stmt) -> bool:
    return isinstance(item, ast.FunctionDef) and item.name == "__init__"


def _names_code(statement: ast.Assign | ast.AnnAssign) -> bool:
    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
    return any(isinstance(t, ast.Name) and t.id == "code" for t in targets)


def _assigned_to_code(target: ast.expr, value: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name) and target.id == "code":
        yield from _constants(value)
    elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
        for part, part_value in zip(target.elts, value.elts, strict=False):
            yield from _assigned_to_code(part, part_value)


def _constants(value: ast.expr | None) -> Iterator[str]:
    """The string constants an expression can evaluate to (not those it compares with)."""
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        yield value.value
    elif isinstance(value, ast.IfExp):
        yield from _constants(value.body)
        yield from _constants(value.orelse)
    elif isinstance(value, ast.BoolOp):
        for operand in value.values:
            yield from _constants(operand)
    elif isinstance(value, ast.Dict):
        for item in value.values:
            yield from _constants(item)
    elif isinstance(value, ast.Call) and _name(value.func) == "get":
        assert isinstance(value.func, ast.Attribute)
        yield from _constants(value.func.value)


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return "?"
