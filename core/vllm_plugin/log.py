"""The plugin logs under vLLM's logger tree so its lines land in the server log with vLLM's format."""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm.hybridserve")
