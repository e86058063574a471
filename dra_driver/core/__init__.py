"""Pure domain logic: no I/O, no gRPC, no Kubernetes client, no NVML.

Sub-packages, each with its face in its ``__init__.py``: ``slices`` (the
ResourceSlices and the API's rules for them), ``cdi`` (CDI specs and container
edits), ``health`` (device health) and ``prepare`` (what a claim gets at
prepare); ``slices``, ``cdi`` and ``health`` are independent of each other.
They stand on the basics here: ``model``, ``ports``, ``settings``,
``published``, ``allocation`` and ``claim_shape``.
"""
