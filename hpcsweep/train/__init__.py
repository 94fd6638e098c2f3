"""Each worker: trainer, model, data, optimiser, checkpoints, metrics and TensorBoard events.

``python -m hpcsweep.train TRIAL_DIR`` is the torchrun worker entry. The top holds the worker, the trainer and
what builds, wraps and trains the model, over the base modules ``distributed``, ``fault`` and ``gpu_choices``;
the rest is in rooms, one concern each: ``data``, ``moe``, ``checkpoint``, ``trackers``, ``observe``,
``scores``, ``preference`` (hpcsweep/README.md lists them; a room imports down, never the top).

May import only the shared packages and ``results``; never ``sweep``, ``trial`` or a command module.
"""
