"""The files the stages hand each other: atomic writes, ``sweep.json``, ``metrics.json`` and the trial's TensorBoard run.

Shared by every stage. May import only ``config``; never a stage or a command module, and no torch.
"""
