"""A MoE model's routed experts: their LoRA, the router's balance, and what the routers did each window.

The experts' adapters as grouped GEMMs (``expert_lora``), the balance loss and DeepSeek-V3's bias update
(``load_balance``), the tokens a batch routes (``routed_tokens``), and the router statistics of transformers'
routers (``router_stats``) and of a model whose own code routes (``own_gate_stats``). Of ``train``, imports
only this room, ``data`` and the base modules ``distributed``, ``fault`` and ``gpu_choices``; never
``trainer``, ``worker``, train's other top modules or any other room.
"""
