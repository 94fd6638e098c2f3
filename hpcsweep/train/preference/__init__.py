"""Preference tuning: DPO's losses on a pair's answers, and each answer's log-probability from packed rows.

The losses of ``objective=dpo``, its variants as TRL's ``DPOTrainer`` defines them, and the metrics TRL logs
(``dpo_loss``); each answer's summed log-probability from the logits of rows that may pack several samples,
or at the LM head from its hidden states, one chunk of fp32 work at a time (``answer_logps``); a micro-batch's
reference (the model with its adapters off) and policy log-probabilities and its loss, for the trainer
(``dpo_step``). Of ``train``, imports only this room and the base modules
``distributed``, ``fault`` and ``gpu_choices``; never ``trainer``, ``worker``, train's other top modules or any
other room.
"""
