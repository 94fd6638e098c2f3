"""The rows a worker trains on: token windows, chat samples, documents and preference pairs in rows, and their attention.

Token windows and whole samples (``corpora``, ``samples``, ``document_rows``), packed into rows (``packing``),
preference pairs as rows of answers (``pairs``),
a micro-batch (``batch``), and what the attention is told so that packed samples stay apart
(``sample_attention``). Of ``train``, imports only this room and the base modules ``distributed``, ``fault``
and ``gpu_choices``; never ``trainer``, ``worker``, train's other top modules or any other room.
"""
