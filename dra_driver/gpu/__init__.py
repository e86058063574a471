"""GPU discovery behind the :class:`~dra_driver.core.ports.GpuBackend` protocol."""
