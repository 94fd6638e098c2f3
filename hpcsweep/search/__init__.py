"""Adaptive search: the space in Hydra's sweep syntax, the Optuna study in SWEEP_DIR, each trial slot's
choice of parameters, the trainer's pruning reports, and the warm start of a new study from the
finished trials of earlier sweeps.

Shared by the stages that take part in a search (the sweeper's checks, each array task, each
worker's rank 0). May import only ``config``, ``files`` and ``slurm``; never a stage or a command module.
``optuna`` is imported only where a search runs, and no torch.
"""
