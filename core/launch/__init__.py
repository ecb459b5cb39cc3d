"""From a topology and a role to checked command lines and environment: the launch plan (pure; the machine's
facts come from core/host, the processes are core/supervise's)."""
