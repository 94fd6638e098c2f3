"""Each worker: trainer, model, data, optimiser, checkpoints, metrics and TensorBoard events.

``python -m hpcsweep.train TRIAL_DIR`` is the torchrun worker entry. May import ``hpcsweep.config``,
``hpcsweep.control``, ``hpcsweep.files`` and ``hpcsweep.results.hparams``; never ``sweep``, ``trial``, ``slurm`` or a command module.
"""
