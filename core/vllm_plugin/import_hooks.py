"""Run a callback right after a module is imported (or at once if it already is), without editing any file.

The plugin patches vLLM and NIXL modules that are imported lazily, late and only in some processes (the worker
imports the NIXL connector when the engine starts). A meta-path finder wraps the named module's loader so the
callback sees the fully executed module. Each callback runs once per process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType

Callback = Callable[[ModuleType], None]
_pending: dict[str, list[Callback]] = {}


def after_import(module_name: str, callback: Callback) -> None:
    """Call `callback(module)` once `module_name` has been imported in this process."""
    module = sys.modules.get(module_name)
    if module is not None and getattr(module, "__spec__", None) is not None and not _is_initializing(module):
        callback(module)
        return
    _pending.setdefault(module_name, []).append(callback)
    if not any(isinstance(f, _AfterImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder())


def _is_initializing(module: ModuleType) -> bool:
    return bool(getattr(module.__spec__, "_initializing", False))


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):  # noqa: ANN001 (importlib's signature)
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _CallbackLoader(spec.loader, _pending.pop(fullname))
                return spec
        return None


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, callbacks: list[Callback]) -> None:
        self.inner, self.callbacks = inner, callbacks

    def create_module(self, spec: importlib.machinery.ModuleSpec):  # noqa: ANN201
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        for callback in self.callbacks:
            callback(module)
