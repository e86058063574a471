"""`python -m dra_driver` is the same as the `dra-driver` console script."""

from dra_driver.cli import run

raise SystemExit(run())
