"""One trial on one node: the attempt (``attempt``), then admit, launch and settle (``runner``).

May import only the shared packages, ``train`` and ``results``; never ``sweep`` or a command module.
"""
