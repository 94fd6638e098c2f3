"""``python -m hpcsweep.export``: a trial's weights as a Hugging Face model folder or a peft adapter.

Checkpoints are for resuming (sharded DCP, optimizer and RNG included); an export is for sharing:
what ``transformers``, ``peft``, vLLM and lm-eval load. ``source`` chooses the trial and its
checkpoint (pure decisions on the files of a sweep dir, a running sweep refused), ``weights`` reads
the checkpoint into a model on CPU, ``dtypes`` chooses each tensor's dtype (the base's own),
``base_files`` copies the base's tokenizer and remote code byte for byte, ``model_card`` writes the
``README.md``, ``writer`` puts the folder together.

A tool beside the stages, run after a sweep: May import only the shared packages, ``train`` and
``results``; never ``sweep``, ``trial`` or a command module. No stage imports it.
"""
