"""Lossy steps: what an export may give up for speed or bytes, each one plug-in with a hook per
stage (base.py's ``LossyStep``) — quantized projections (projections/: round to nearest, a GGUF's
own blocks) and an int8 KV cache (int8_cache/) — collected in registry.py. The check measures
each step's cost apart from the runners' kernel parity; the stages ask the registry."""
