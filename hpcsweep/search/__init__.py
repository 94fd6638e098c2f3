"""Adaptive search: the space in Hydra's sweep syntax, the Optuna study in SWEEP_DIR, each trial slot's
choice of parameters, and the trainer's pruning reports.

Shared by the stages that take part in a search (the sweeper's checks, each array task, each
worker's rank 0), so it imports nothing of hpcsweep but ``config``, ``files``, ``slurm`` and itself;
``optuna`` is imported only where a search runs, and no torch.
"""
