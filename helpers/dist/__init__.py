"""Processes and communication: starting workers, collectives, the latency-bandwidth model,
DDP's buckets and hooks, checkpoints, torchrun on clusters and network namespaces."""
