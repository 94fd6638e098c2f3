"""A trial's checkpoints: what is saved, when, where, and how a resume reads it back.

The manager that saves in the background and keeps ``newest + top-k`` (``manager``), when a save is due
(``schedule``), the DCP storage and its safe metadata reader (``store``), each rank's RNG state
(``rng_state``), and the weights that train (``trained_state``). Of ``train``, imports only this room and the
base modules ``distributed``, ``fault`` and ``gpu_choices``; never ``trainer``, ``worker``, train's other top
modules or any other room.
"""
