"""The preparation job: read a corpus or chat file, render it with the model's template, tokenize it in worker processes, publish the cache entry.

``text_documents`` reads the corpus in pieces, ``chat_render`` renders a chat sample with the tokenizer's
own template, ``text_tokens`` and ``chat_tokens`` tokenize the pieces in a pool of worker processes, and
``cache_entry`` publishes the entry whole or not at all. ``python -m hpcsweep.prepare`` (``text_tokens.main``) is
the Slurm job a ``data=text`` or ``chat`` sweep's trials wait on (``hpcsweep.sweep.text_preparation``); a local
sweep writes its entries with the same code before its first trial.

It runs between the login node and the trials and imports no trainer. May import only ``config``,
``files`` and ``model``; never a stage or a command module. The login node (``sweep``), the workers
(``train``: the tokenizer and its pad id) and ``export`` (a chat prompt) read it.
"""
