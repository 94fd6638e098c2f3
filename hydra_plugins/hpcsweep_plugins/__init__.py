"""hpcsweep's Hydra launchers and sweeper, registered as options any Hydra app can select.

``hpcsweep_auto`` picks Slurm when a controller answers, else local processes; ``hpcsweep_slurm``
submits one job array per allocation shape; ``hpcsweep_local`` runs trials on this machine;
``hydra/sweeper=hpcsweep_grid`` is Hydra's grid sweeper without a second composition of each trial.
The classes must be defined under ``hydra_plugins`` for Hydra to accept them; the work they do
lives in ``hpcsweep.sweep``, imported lazily so that Hydra's start-up stays fast.
"""
