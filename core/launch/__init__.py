"""From a topology and a role to checked command lines, and the processes that run them."""
