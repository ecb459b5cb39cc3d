"""What an installed package's modules define, read from their source with `ast`: nothing is imported.

The plugin patches vLLM by name. Before a server starts (launch's preflight, and the plugin's own check in the
first vLLM process) every name a patch needs is looked up here, so a vLLM whose names moved is refused at start-up
instead of failing inside a request. Reading source costs milliseconds and imports nothing: launch stays free of
torch and vllm, and a check of another vLLM's source tree (an unpacked wheel) works on any machine.

What counts as defined:
- in a module: a top-level def, class, assignment target or imported name;
- in a class: a method, a class-body assignment or annotation (dataclass fields), or an attribute that any method
  assigns on `self` (`self.x = ...`, `self.x: T = ...`, `self.x += ...`), in the class or in a base class that
  resolves to a class of the same source tree (followed through `from X import Y` and `import X as Y`).
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class ClassInfo:
    module: str
    name: str
    members: frozenset[str]  # methods, class-body names, attributes assigned on self
    bases: tuple[str, ...]  # as written: "Name" or "mod.Name"


@dataclass(kw_only=True)
class ModuleInfo:
    name: str
    names: set[str] = field(default_factory=set)  # top-level definitions and imports
    imports: dict[str, str] = field(default_factory=dict)  # local name -> "module" or "module:Name"
    classes: dict[str, ClassInfo] = field(default_factory=dict)


def _self_targets(node: ast.AST) -> set[str]:
    """Attributes stored on `self` anywhere inside `node` (assignments, annotated and augmented ones)."""
    return {sub.attr for sub in ast.walk(node)
            if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
            and isinstance(sub.value, ast.Name) and sub.value.id == "self"}


def _class_info(module: str, node: ast.ClassDef) -> ClassInfo:
    members: set[str] = _self_targets(node)
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            members.add(item.name)
        elif isinstance(item, ast.Assign):
            members |= {t.id for t in item.targets if isinstance(t, ast.Name)}
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            members.add(item.target.id)
    return ClassInfo(module=module, name=node.name, members=frozenset(members),
                     bases=tuple(ast.unparse(b) for b in node.bases))


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    parts = module.split(".") if is_package else module.split(".")[:-1]
    base = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join([*base, target] if target else base)


def parse_module(name: str, source: str, *, is_package: bool = False) -> ModuleInfo:
    info = ModuleInfo(name=name)
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            info.names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            info.names.add(node.name)
            info.classes[node.name] = _class_info(name, node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            info.names |= {leaf.id for t in targets for leaf in ast.walk(t) if isinstance(leaf, ast.Name)}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                info.names.add(local)
                info.imports[local] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            source_module = (_resolve_relative(name, is_package, node.level, node.module) if node.level
                             else node.module or "")
            for alias in node.names:
                local = alias.asname or alias.name
                info.names.add(local)
                info.imports[local] = f"{source_module}:{alias.name}"
    return info


class SourceIndex:
    """Modules of the packages under `root` (a site-packages folder, or an unpacked wheel), parsed on demand."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._modules: dict[str, ModuleInfo | None] = {}

    @classmethod
    def installed(cls, package: str = "vllm") -> SourceIndex | None:
        """The tree that holds the installed `package` (found without importing it); None when it is absent."""
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        return cls(Path(next(iter(spec.submodule_search_locations))).parent)

    def module(self, name: str) -> ModuleInfo | None:
        if name not in self._modules:
            self._modules[name] = self._load(name)
        return self._modules[name]

    def _load(self, name: str) -> ModuleInfo | None:
        path = self.root.joinpath(*name.split("."))
        for file, is_package in ((path.with_suffix(".py"), False), (path / "__init__.py", True)):
            if file.is_file():
                return parse_module(name, file.read_text(encoding="utf-8", errors="replace"),
                                    is_package=is_package)
        return None

    def find_class(self, module: str, name: str, depth: int = 0) -> ClassInfo | None:
        """The class `name` as seen from `module`: defined there, or imported into it from this tree."""
        info = self.module(module)
        if info is None or depth > 8:
            return None
        if name in info.classes:
            return info.classes[name]
        where = info.imports.get(name)
        if where and ":" in where:
            origin, _, original = where.partition(":")
            return self.find_class(origin, original, depth + 1)
        return None

    def _base_class(self, cls: ClassInfo, base: str) -> ClassInfo | None:
        head, _, tail = base.partition(".")
        if not tail:
            return self.find_class(cls.module, head)
        where = (self.module(cls.module) or ModuleInfo(name=cls.module)).imports.get(head)
        return self.find_class(where, tail) if where and ":" not in where else None

    def class_has(self, cls: ClassInfo, member: str, seen: frozenset[str] = frozenset()) -> bool:
        key = f"{cls.module}.{cls.name}"
        if member in cls.members:
            return True
        if key in seen:
            return False
        for base in cls.bases:
            parent = self._base_class(cls, base)
            if parent is not None and self.class_has(parent, member, seen | {key}):
                return True
        return False

    def has(self, module: str, dotted: str) -> bool:
        """`name` (a top-level name of `module`) or `Class.member` (through the class's bases)."""
        head, _, member = dotted.partition(".")
        if not member:
            info = self.module(module)
            return info is not None and head in info.names
        cls = self.find_class(module, head)
        return cls is not None and self.class_has(cls, member)
