"""Packaging; the metadata lives in setup.cfg.

The top-level ``configs/`` folder ships inside the package as ``hpcsweep.configs``, so a plain
``pip install .`` carries the Hydra configs just as an editable install does.
"""

from setuptools import find_namespace_packages, setup

CONFIG_GROUPS = ["", "model", "data", "trainer", "objective", "nccl", "topology", "tasks", "hydra", "hydra/launcher"]

packages = find_namespace_packages(include=["hpcsweep", "hpcsweep.*", "hydra_plugins.*"])
packages += ["hpcsweep.configs"]

setup(
    packages=packages,
    package_dir={"hpcsweep.configs": "configs"},
    package_data={"hpcsweep.configs": [f"{group}/*.yaml".lstrip("/") for group in CONFIG_GROUPS]},
)
