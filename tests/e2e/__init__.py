"""End-to-end tests: the examples under deploy/examples on a real cluster (KUBECONFIG)."""
