"""The processes that run stages: local workers or torchrun's ranks, the protocol between the driver and
them, the pools, the host's cores and GPUs."""
