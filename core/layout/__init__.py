"""vLLM's memory layout of KV cache and GDN state, capacity and transfer descriptors (pure; no torch)."""
