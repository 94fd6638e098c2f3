"""One trial on one node: the attempt (``attempt``), then admit, launch and settle (``runner``).

May import ``hpcsweep.config``, ``hpcsweep.control``, ``hpcsweep.files``, ``hpcsweep.slurm`` and ``hpcsweep.train``;
never ``sweep``, ``results`` or a command module.
"""
