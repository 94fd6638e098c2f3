"""hpcsweep: hyperparameter sweeps of transformer training on Slurm GPU clusters."""

__version__ = "0.1.0"
