"""The kubelet plugin's default names and paths (no imports: the CLI reads them
for every subcommand, the mps-agent's included)."""

DEFAULT_DRIVER_NAME = "gpu.fractional.dev"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_CDI_ROOT = "/var/run/cdi"
