"""Tools run by hand from the repository root (not installed with the package): ``python -m tools.<name>``."""
