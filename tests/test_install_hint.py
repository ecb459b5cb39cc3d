"""Install hints name a command that installs the missing extra the way this copy was installed."""

import json

import pytest

from hybridserve.core.common import install_hint
from hybridserve.core.common.errors import MissingExtraError
from hybridserve.core.common.install_hint import install_command


def test_checkout_install_names_its_folder(tmp_path):
    url = {"url": tmp_path.as_uri(), "dir_info": {"editable": True}}
    assert install_command("cuda", direct_url=url, has_torch=True) == f"pip install '{tmp_path}[cuda]'"


def test_index_install_or_vanished_source_names_the_package(tmp_path):
    gone = {"url": (tmp_path / "gone").as_uri(), "dir_info": {}}
    assert install_command("cuda", direct_url=gone, has_torch=True) == "pip install 'hybridserve[cuda]'"
    assert install_command("cuda", direct_url={}, has_torch=True) == "pip install 'hybridserve[cuda]'"


def test_cpu_extra_without_torch_installs_cpu_torch_first(tmp_path):
    url = {"url": tmp_path.as_uri(), "dir_info": {}}
    assert install_command("cpu", direct_url=url, has_torch=False) == (
        f"pip install torch==2.13.0 && pip install '{tmp_path}[cpu]'")
    assert install_command("cuda", direct_url=url, has_torch=False) == f"pip install '{tmp_path}[cuda]'"


def test_reads_the_installed_distributions_direct_url(monkeypatch, tmp_path):
    class Dist:
        def __init__(self, text):
            self.text = text

        def read_text(self, name):
            return self.text if name == "direct_url.json" else None

    found = [Dist(None), Dist(json.dumps({"url": tmp_path.as_uri(), "dir_info": {}}))]
    monkeypatch.setattr(install_hint.importlib.metadata, "distributions", lambda name: iter(found))
    assert install_command("router", has_torch=True) == f"pip install '{tmp_path}[router]'"


@pytest.mark.parametrize("module,extra", [("nixl", "cpu"), ("vllm", "cuda"), ("httpx", "cpu")])
def test_missing_extra_message_carries_the_command(monkeypatch, module, extra, tmp_path):
    monkeypatch.setattr(install_hint, "_direct_url", lambda: {"url": tmp_path.as_uri(), "dir_info": {}})
    message = str(MissingExtraError(module, extra, "transfer bench"))
    assert message.startswith(f"transfer bench needs '{module}': install it with  ")
    assert message.endswith(f"pip install '{tmp_path}[{extra}]'")
