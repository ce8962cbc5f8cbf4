"""Build and release tooling for opmux: imported by noxfile.py, setup.py and tests/packaging."""
