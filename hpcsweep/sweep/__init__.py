"""The sweep on the login node: compose and validate every trial, check it against the cluster, submit, write sweep.json.

May import only the shared packages, ``trial``, ``train`` and ``results``; never a command module, and no torch
(it runs on the login node).
"""
