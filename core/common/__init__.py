"""What every concept of core shares: typed errors, choice parsing, arithmetic, atomic files, and the contracts
between processes (contracts.py: environment variables, log lines, run-folder files)."""
