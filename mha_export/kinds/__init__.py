"""Attention kinds: what every stage asks of a kind of attention layer (kinds/base.py's
``AttentionKind``), one record each — standard multi-head / grouped-query attention
(standard.py) and Multi-head Latent Attention (mla/: its settings, eager layer, graph and forms
together) — collected in registry.py. A config's kind is its section (``MHAConfig.kind``)."""
