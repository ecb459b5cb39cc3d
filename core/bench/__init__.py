"""`hybridserve bench`: served latency and throughput of a P/D deployment beside a baseline, with decode's NIXL stats."""
