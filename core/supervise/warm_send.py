"""Send one engine its warm-up burst (warmup.py): every request at once, each in a thread, each with its deadline.

Prompts are token ids (vLLM's /v1/completions takes a list of ints), drawn from the lower half of the vocabulary
above its first eighth, where no model of the family keeps its special tokens (Qwen's sit at the top; the tiny
models' pad and eos are 0). Greedy, `ignore_eos`: every request decodes its `max_tokens`.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hybridserve.core.common.errors import CouldNotRunError
from hybridserve.core.launch import keys
from hybridserve.core.launch.launch_plan import RoleCommand
from hybridserve.core.launch.warmup import WarmupBurst


def engine_key(command: RoleCommand, run_dir: Path) -> str | None:
    """The key the engine asks for (its VLLM_API_KEY file; relative: inside the run folder), or None."""
    for name, path in command.secret_env:
        if name == keys.ENGINE_KEY_ENV:
            return keys.read_key(path if path.is_absolute() else run_dir / path, what="engine key file")
    return None


def warm_up(command: RoleCommand, burst: WarmupBurst, *, model_name: str, vocab_size: int, key: str | None,
            timeout_s: float) -> float:
    """Send the burst to `command`'s server and wait for every answer; the seconds it took. CouldNotRunError naming
    the role when a request fails or outlasts `timeout_s` (the burst's own deadline)."""
    rng = random.Random(command.port)
    low, high = max(1, vocab_size // 8), max(2, vocab_size // 2)
    served = _served_context(command.url, key, timeout_s)  # what vLLM resolved (--max-model-len auto: known only now)
    lengths = [n for n in burst.prompt_tokens if served is None or n + burst.max_tokens <= served]
    bodies = [{"model": model_name, "prompt": [rng.randrange(low, high) for _ in range(n)],
               "max_tokens": burst.max_tokens, "temperature": 0.0, "ignore_eos": True}
              for n in lengths]
    begun = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, len(bodies)), thread_name_prefix="warm-up") as pool:
        answers = list(pool.map(lambda body: _complete(command.url, body, key, timeout_s), bodies))
    for prompt_tokens, why in zip(lengths, answers):
        if why is not None:
            raise CouldNotRunError(f"{command.name}: its warm-up request of {prompt_tokens} prompt tokens failed "
                                   f"({why}); log {command.name}.log in the run folder")
    return time.monotonic() - begun


def _served_context(url: str, key: str | None, timeout_s: float) -> int | None:
    """The served model's max_model_len from vLLM's /v1/models; None when it does not say (then the plan's holds)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{url}/v1/models", headers=_headers(key)),
                                    timeout=timeout_s) as response:
            cards = json.loads(response.read()).get("data") or [{}]
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return None
    context = cards[0].get("max_model_len") if isinstance(cards[0], dict) else None
    return context if isinstance(context, int) and context > 0 else None


def _headers(key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def _complete(url: str, body: dict, key: str | None, timeout_s: float) -> str | None:
    """None when the server answered 200 with a completion; else why not, in a few words (never the key)."""
    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(), headers=_headers(key))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return type(getattr(exc, "reason", exc)).__name__ if not isinstance(exc, ValueError) else "not JSON"
    return None if answer.get("choices") else "an answer with no choices"
