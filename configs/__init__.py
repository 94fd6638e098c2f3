"""hpcsweep's Hydra configs, shipped inside the package as ``hpcsweep.configs``."""
