"""The sweep on the login node: compose and validate every trial, check it against the cluster, submit, write sweep.json.

May import ``hpcsweep.config``, ``hpcsweep.files``, ``hpcsweep.slurm`` and the later stages it hands work to
(``trial``, ``train``) lazily; never ``results`` and never a command module.
"""
