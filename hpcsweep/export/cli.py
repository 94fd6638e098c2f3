"""``python -m hpcsweep.export SWEEP_DIR (--best | --trial N) --out DIR [--merge]``: a trial in Hugging Face format.

A sweep with a trial still pending or running is refused (``--trial N`` of a finished trial is
not; ``--allow-running`` takes the checkpoints written so far and says which one it took). An
adapter names its base as the trial's ``model.path`` was typed, or ``--base-name``; a model is
written in its base's dtypes, or ``--dtype``.

Writes the best trial (lowest ``best_val_loss``) or trial N, from its checkpoint with the lowest
validation loss (``--checkpoint last``: its newest), as a model folder that ``from_pretrained`` loads:
for full fine-tuning or pretraining the model; for LoRA a peft adapter, or with ``--merge`` the
adapter merged into its base. A ``README.md`` model card says what trained and how well. Refuses a
trial without a checkpoint and an ``--out`` that exists and is not empty, each in one line (exit 2).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hpcsweep.export.dtypes import DTYPES
from hpcsweep.files.sweep_record import missing_sweep_message

EXPORT_COMMAND = "python -m hpcsweep.export"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=EXPORT_COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="the sweep's multirun dir (holds sweep.json), or a trial dir")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--best", action="store_true", help="the trial with the lowest best_val_loss")
    which.add_argument("--trial", type=int, metavar="N", help="trial N of the sweep")
    parser.add_argument("--by", default="best_val_loss", metavar="KEY",
                        help="with --best: the metrics.json key that ranks trials, e.g. tasks.NAME.acc (default: %(default)s)")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="a new (or empty) folder")
    parser.add_argument("--merge", action="store_true", help="LoRA: merge the adapter into its base, one full model")
    parser.add_argument("--checkpoint", choices=("best", "last"), default="best",
                        help="the trial's checkpoint with the lowest validation loss, or its newest (default: %(default)s)")
    parser.add_argument("--max-shard-size", default="5GB",
                        help="safetensors files are split above this size, with an index (default: %(default)s)")
    parser.add_argument("--allow-running", action="store_true",
                        help="export although trials are still pending or running (their newest checkpoints)")
    parser.add_argument("--base-name", metavar="NAME",
                        help="what the adapter names its base (base_model_name_or_path), e.g. a hub name such as "
                             "deepseek-ai/deepseek-moe-16b-base (default: model.path as the trial was given it)")
    parser.add_argument("--dtype", choices=sorted(DTYPES),
                        help="write every weight in this dtype (default: each tensor in the base's own dtype)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Export as asked; 0 when written, 2 when refused (the reason on stderr, one line)."""
    args = parse_args(argv)
    # Models and tokenizers come from local folders only, never from a hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from hpcsweep.export.source import (
        ExportRefused, choose_source, out_dir_refusal, running_note, running_refusal, trial_statuses,
    )

    try:
        refusal = out_dir_refusal(args.out)
        if refusal:
            raise ExportRefused(refusal)
        statuses = {} if missing_sweep_message(args.sweep_dir) else trial_statuses(args.sweep_dir)
        refusal = None if args.allow_running else running_refusal(statuses, args.trial, args.sweep_dir)
        if refusal:
            raise ExportRefused(refusal)
        source = choose_source(args.sweep_dir, args.trial, args.checkpoint, by=args.by)
        from transformers.utils import logging as transformers_logging

        from hpcsweep.export.writer import ExportOptions, export_trial

        transformers_logging.disable_progress_bar()
        options = ExportOptions(merge=args.merge, max_shard_size=args.max_shard_size, base_name=args.base_name,
                                dtype=DTYPES[args.dtype] if args.dtype else None)
        files = export_trial(source, args.sweep_dir, args.out, options)
    except ExportRefused as err:
        print(f"{EXPORT_COMMAND}: {err}", file=sys.stderr)
        return 2
    note = running_note(source, statuses)
    if note:
        print(f"{EXPORT_COMMAND}: {note}", file=sys.stderr)
    print(f"exported trial #{source.trial.num} ({source.checkpoint.name}) to {args.out}: {', '.join(files)}")
    return 0
