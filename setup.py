from setuptools import setup

# pyproject.toml holds the metadata; this shim keeps `python setup.py develop`-era tooling working
setup()
