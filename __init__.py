"""hybridserve: plan, tune, launch and validate hybrid GDN + attention models on vLLM with P/D over NIXL."""

__version__ = "0.1.0"
