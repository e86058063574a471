"""fractional-gpu-dra: a Kubernetes DRA driver for fractional NVIDIA GPU claims."""

__version__ = "0.1.0"
