"""An engine's vLLM command line (core/launch/engine_command.py) as Ray Serve LLM's `engine_kwargs`.

Ray hands `engine_kwargs` to vLLM's AsyncEngineArgs and refuses a name vLLM does not know ("Unknown engine
argument"), so the flags map one to one: `--block-size 128` -> block_size: 128, `--no-enable-prefix-caching` ->
enable_prefix_caching: false (vLLM's BooleanOptionalAction), `--enforce-eager` -> enforce_eager: true, a JSON value
(`--kv-transfer-config {...}`) -> the object. Launch's own flags and the passthrough ones (`--vllm-arg`, extra_args)
go the same way, so what `launch` sets on one host and what Ray starts cannot drift.

Left out, because Ray Serve owns them: the model and its served name (LLMConfig.model_loading_config), the HTTP
host and port (the engine has none: Ray's ingress is the door) and `--middleware` (the engine guard of an HTTP
server that does not exist here).
"""

from __future__ import annotations

import json
from typing import Any

from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.passthrough import flag_name
from hybridserve.core.launch.seqs_fit import parse_vllm_bytes

SERVE_OWNED = frozenset({"--model", "--served-model-name", "--host", "--port", "--middleware"})
# vLLM's command line reads these with `human_readable_int` ('6g' is 6e9, '32K' 32,768; max_model_len also 'auto'):
# engine/arg_utils.py `add_cli_args`, read in 0.26 and 0.32 (0.32 adds max_num_queued_tokens). Ray hands
# engine_kwargs to AsyncEngineArgs unparsed, where '6g' would stay text, so they are parsed here as vLLM's CLI would
HUMAN_READABLE_INTS = frozenset({"max_num_batched_tokens", "max_num_scheduled_tokens", "kv_cache_memory_bytes",
                                 "safetensors_prefetch_block_size", "max_num_queued_tokens", "max_model_len"})


def engine_kwargs(flags: tuple[str, ...]) -> dict[str, Any]:
    """`flags`: vLLM flags and values as on a command line (no program name)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(flags):
        flag = flags[i]
        name, has_inline, inline = flag.partition("=")
        if not name.startswith("--"):
            raise InputError(f"vLLM flag {flag!r}: accepted: --name [value] (Ray's engine_kwargs take long flags)")
        takes_value = has_inline or (i + 1 < len(flags) and not _is_flag(flags[i + 1]))
        value = (inline if has_inline else flags[i + 1]) if takes_value else None
        i += 1 + (takes_value and not has_inline)
        if name in SERVE_OWNED:
            continue
        key = name[2:].replace("-", "_")
        if value is None and key.startswith("no_"):
            out[key[3:]] = False
        elif value is not None and key in HUMAN_READABLE_INTS:
            out[key] = _human_readable_int(name, value)
        else:
            out[key] = True if value is None else _value(value)
    return out


def _human_readable_int(flag: str, text: str) -> int:
    if flag == "--max-model-len" and text.strip() == "auto":
        return -1  # vLLM's human_readable_int_or_auto
    try:
        return parse_vllm_bytes(text)
    except InputError:
        raise InputError(f"vLLM flag {flag} {text}: accepted: a whole number, or one with k, m, g, t (decimal) or "
                         "K, M, G, T (binary)") from None


def _is_flag(word: str) -> bool:
    """A word that starts a flag, not a value (a negative number is a value: passthrough.flag_name's rule)."""
    return flag_name(word) is not None


def _value(text: str) -> Any:
    """A number, a JSON object or list as itself; anything else (a dtype, a backend, a path, true) as text."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (int, float, dict, list)) and not isinstance(value, bool) else text
