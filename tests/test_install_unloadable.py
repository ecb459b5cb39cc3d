"""A package whose C extension cannot load (OSError at import) counts as absent; one that loads imports as usual."""

import importlib.util
import sys

from hybridserve.core.vllm_plugin.unloadable_extensions import block_unloadable


def _package(root, name, body):
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(body)
    (root / name / "sub.py").write_text("X = 1\n")


def test_blocks_only_the_package_that_raises_oserror(tmp_path, monkeypatch):
    _package(tmp_path, "hs_broken_ext", "from . import sub\nraise OSError('Could not load this library: _x.so')\n")
    _package(tmp_path, "hs_good_ext", "from . import sub\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("hs_broken_ext", "hs_broken_ext.sub", "hs_good_ext", "hs_good_ext.sub"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    try:
        assert block_unloadable(("hs_broken_ext", "hs_good_ext", "hs_absent_ext")) == ["hs_broken_ext"]
        assert "hs_broken_ext.sub" not in sys.modules
        assert importlib.util.find_spec("hs_broken_ext") is None  # transformers' availability check
        try:
            import hs_broken_ext  # noqa: F401
        except ImportError:
            pass
        else:
            raise AssertionError("the blocked package imported")
        import hs_good_ext

        assert hs_good_ext.sub.X == 1
    finally:
        for name in ("hs_broken_ext", "hs_good_ext", "hs_good_ext.sub"):
            sys.modules.pop(name, None)
