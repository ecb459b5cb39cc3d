"""core/common/atomic_file.py: a result file is the old one or the whole new one, never part of one."""

from __future__ import annotations

import stat

import pytest

from hybridserve.core.common.atomic_file import replaced_on_success, write_bytes, write_text


def test_a_written_file_replaces_the_old_one_readable_by_others(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("old")
    write_text(path, "new")
    assert path.read_text() == "new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's private 0600
    write_bytes(path, b"<xml/>")
    assert path.read_bytes() == b"<xml/>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_an_error_while_writing_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "figure.png"
    path.write_bytes(b"old figure")
    with pytest.raises(KeyboardInterrupt):
        with replaced_on_success(path, suffix=".png") as tmp:
            assert tmp.parent == tmp_path and tmp.suffix == ".png"  # savefig picks its format by the suffix
            tmp.write_bytes(b"half a fig")
            raise KeyboardInterrupt
    assert path.read_bytes() == b"old figure"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figure.png"]


def test_a_bare_file_name_is_written_in_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_text(type(tmp_path)("junit.xml"), "x")
    assert (tmp_path / "junit.xml").read_text() == "x"
