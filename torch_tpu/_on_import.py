"""Patches applied to third-party modules once they have been imported, never by importing
them here (`import torch` must stay fast, and most programs never import them).

A patch runs right after its module has executed: an import hook wraps the module's
loader. A module already imported is patched at once. A module still executing when
torch_tpu loads (it imported torch, whose start-up loads torch_tpu: `from accelerate
import ...` before `import torch`) is patched when it has run: importlib then sets it as
an attribute of its package, which is watched until then.
"""
import importlib.abc
import importlib.util
import sys
import types

_pending = {}  # module name -> (a name the module defines once executed, patch)


def patch_when_imported(name: str, defines: str, patch) -> None:
    """Runs `patch(module)` once module `name` has executed (it then has `defines`)."""
    module = sys.modules.get(name)
    if module is not None and hasattr(module, defines):
        patch(module)
        return
    _pending[name] = (defines, patch)
    if module is not None:  # still executing: watch its package
        package = sys.modules.get(name.rpartition(".")[0])
        if package is not None and type(package) is types.ModuleType:
            package.__class__ = _PatchOnceSet
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def _run(name: str, module) -> None:
    entry = _pending.get(name)
    if entry is not None and hasattr(module, entry[0]):
        del _pending[name]
        entry[1](module)


class _PatchOnceSet(types.ModuleType):
    def __setattr__(self, attr, value):
        super().__setattr__(attr, value)
        _run(f"{self.__name__}.{attr}", value)
        if not any(n.rpartition(".")[0] == self.__name__ and n in sys.modules for n in _pending):
            object.__setattr__(self, "__class__", types.ModuleType)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, name):
        self._loader, self._name = loader, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _run(self._name, module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _pending:
            return None
        sys.meta_path.remove(self)  # find the real spec below us
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, name)
        return spec
