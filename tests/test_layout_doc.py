"""docs/layout.md is drawn from the code: its layers are pyproject.toml's import-linter layers, in order, and it
names every folder under core/ (issue 54)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "layout.md").read_text()


def _contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    return [" | ".join(name.removeprefix("hybridserve.").replace(".", "/") for name in re.split(r"\s*\|\s*", line))
            for line in layers]


def test_the_doc_lists_the_layers_of_the_import_contract_in_order():
    block = DOC.split("<!-- layers:", 1)[1].split("<!-- end layers -->", 1)[0]
    listed = [line.strip() for line in block.split("```")[1].strip().splitlines()]
    assert listed == _contract_layers()


def test_every_folder_under_core_is_a_layer_and_is_named_in_the_doc():
    folders = sorted(p.name for p in (ROOT / "core").iterdir() if (p / "__init__.py").is_file())
    in_layers = {name for line in _contract_layers() for name in line.split(" | ")}
    assert [f for f in folders if f"core/{f}" not in in_layers] == []
    assert [f for f in folders if f"core/{f}/" not in DOC] == []


def test_every_package_folder_ships_in_the_wheel():
    """pyproject.toml lists the packages by hand (each folder maps to a subpackage): a new folder left out of it
    imports from the checkout and fails in an installed wheel (the wheel of 1b2bd97 lacked core/host)."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"hybridserve." + ".".join(p.parent.relative_to(ROOT).parts)
             for top in ("cli", "core", "kernels", "transfer", "profiles") for p in (ROOT / top).rglob("__init__.py")}
    assert sorted(found - listed) == []
