"""A command whose reader went away (``report ... | head -5``) ends quietly, as a finished one.

Python raises ``BrokenPipeError`` at the first write after the reader closed the pipe, and again when
it flushes stdout on the way out ("Exception ignored ... BrokenPipeError", exit 120). What the reader
did not read is not an error of the command: every file it writes is written before it prints.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


def exit_code(main: Callable[[], int]) -> int:
    """``main()``'s exit code, its output flushed; 0 when stdout's reader closed the pipe first."""
    try:
        code = main()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush has nowhere to fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
