"""Pure domain logic: no I/O, no gRPC, no Kubernetes client, no NVML."""
