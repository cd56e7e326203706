"""Attention kinds: what every stage asks of a kind of attention layer (kinds/base.py's
``AttentionKind``), one record each — standard multi-head / grouped-query attention
(standard.py), Multi-head Latent Attention (mla/: its settings, eager layer, graph and forms
together; DeepSeek Sparse Attention's indexer in dsa/) and cross-layer KV sharing (kv_shared/) —
collected in registry.py. A config's kind is its section (``MHAConfig.kind``; section.py: what
the sections share)."""
