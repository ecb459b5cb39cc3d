"""The chaos bench: SIGKILL the roles of a running `launch --restart on-failure` deployment in turn under a bounded
load and count what each death cost the clients (benchmarks/chaos.py; tests/test_chaos.py asserts its goals)."""
