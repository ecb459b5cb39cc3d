"""Run a callback right before or right after a module is imported, without editing any file.

The plugin patches vLLM and NIXL modules that are imported lazily, late and only in some processes (the worker
imports the NIXL connector when the engine starts). A meta-path finder wraps the named module's loader so an
`after_import` callback sees the fully executed module; a `before_import` callback runs when the module is first
looked for, before any of its code. Each callback runs once per process. A callback that raises is logged and
skipped: a patch that no longer fits a newer vLLM must not take the server down.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable
from types import ModuleType

Callback = Callable[[ModuleType], None]
_logger = logging.getLogger("vllm.hybridserve")
_pending: dict[str, list[Callback]] = {}
_before: dict[str, list[Callable[[], None]]] = {}


def before_import(module_name: str, callback: Callable[[], None]) -> None:
    """Call `callback()` once, just before `module_name` is first imported (never if it already is)."""
    if module_name in sys.modules:
        return
    _before.setdefault(module_name, []).append(callback)
    _ensure_finder()


def after_import(module_name: str, callback: Callback) -> None:
    """Call `callback(module)` once `module_name` has been imported in this process."""
    module = sys.modules.get(module_name)
    if module is not None and getattr(module, "__spec__", None) is not None and not _is_initializing(module):
        _run(callback, module)
        return
    _pending.setdefault(module_name, []).append(callback)
    _ensure_finder()


def _ensure_finder() -> None:
    if not any(isinstance(f, _HookFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _HookFinder())


def _is_initializing(module: ModuleType) -> bool:
    return bool(getattr(module.__spec__, "_initializing", False))


class _HookFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):  # noqa: ANN001 (importlib's signature)
        for callback in _before.pop(fullname, ()):
            _run(callback)
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
            _run(callback, module)


def _run(callback: Callable[..., None], *args: ModuleType) -> None:
    try:
        callback(*args)
    except Exception:  # noqa: BLE001 (see the module docstring)
        _logger.warning("hybridserve plugin: %s failed; vLLM runs unpatched there", callback, exc_info=True)
