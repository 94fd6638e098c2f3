"""A token cache entry appears whole or not at all, whoever writes it (the preparation job, a local
sweep, two preparers at once): its files are written into a staging folder beside it, then renamed
into place; an entry another preparer renamed first is kept."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from hpcsweep.files.atomic import fsync_dir
from hpcsweep.files.token_cache import TextCorpus

log = logging.getLogger(__name__)


def publish_entry(corpus: TextCorpus, write: Callable[[Path], object]) -> Path:
    """``corpus``'s token file, its entry written first unless it is there: ``write(staging)`` fills the
    staging folder, which then becomes the entry."""
    if corpus.is_cached():
        return corpus.token_path
    Path(corpus.cache_dir).mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=corpus.cache_dir, prefix=f".{corpus.key}.", suffix=".tmp"))
    try:
        write(staging)
        try:
            os.rename(staging, corpus.entry)
        except OSError:
            if not corpus.is_cached():
                raise
            log.info("another preparer wrote %s first: keeping its entry", corpus.entry)
        else:
            fsync_dir(corpus.cache_dir)
            log.info("token cache entry %s written", corpus.entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return corpus.token_path
