"""This machine as it is: its GPUs and their memory, an MPS daemon, the installed vLLM, the model folder form that
vLLM loads, the runs still alive. Probes only: nothing here knows a launch plan."""
