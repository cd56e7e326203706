"""Cross-layer KV sharing (Gemma 3n, Gemma 4): a layer that attends with an earlier layer's
keys and values, given to it as inputs (settings.py, layer.py, graph.py, kind.py)."""
