"""`plan --gpus`: replicas against xPyD for a workload and SLOs, simulated from a measured step profile
(`hybridserve step-profile`)."""
