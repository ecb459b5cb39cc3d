"""`make test`'s no-server stream skips the files in the Makefile's SLOW_FILES without importing them; a test in
them that is not slow would then run in no stream at all. Each listed file must be slow as a whole."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _slow_files() -> list[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")  # make joins continued lines
    return re.search(r"^SLOW_FILES\s*:=\s*(.+)$", text, flags=re.M).group(1).split()


def _module_marks(path: Path) -> set[str]:
    """Names of the marks in the module's `pytestmark = [...]`."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)}
    return set()


def test_every_file_the_no_server_stream_skips_is_slow_as_a_whole():
    files = _slow_files()
    assert files, "SLOW_FILES not found in the Makefile"
    for name in files:
        path = ROOT / "tests" / f"{name}.py"
        assert path.is_file(), f"SLOW_FILES names {name}, which is not a test file"
        assert "slow" in _module_marks(path), f"{name}.py: pytestmark must hold pytest.mark.slow"


def test_the_mark_reader_sees_a_module_without_the_mark(tmp_path):
    module = tmp_path / "test_x.py"
    module.write_text("import pytest\npytestmark = [pytest.mark.gpu, pytest.mark.xdist_group('g')]\n")
    assert "slow" not in _module_marks(module) and "gpu" in _module_marks(module)
    module.write_text("import pytest\npytestmark = [pytest.mark.slow]\n")
    assert "slow" in _module_marks(module)
