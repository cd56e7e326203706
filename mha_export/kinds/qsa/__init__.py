"""Qwen4-exp's QSA (block top-k sparse attention): an indexer beside gated grouped-query
attention picks, for each query, the blocks of keys it attends. settings.py (torch-free),
indexer.py and layer.py (eager, TorchScript), kind.py (the registry's record)."""
