"""Each worker: trainer, model, data, optimiser, checkpoints, metrics and TensorBoard events.

``python -m hpcsweep.train TRIAL_DIR`` is the torchrun worker entry. May import only the shared packages and
``results``; never ``sweep``, ``trial`` or a command module.
"""
