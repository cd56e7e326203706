"""An int8 static KV cache (--kv-cache-dtype int8): its codes' arithmetic and record (codes.py),
its static scales (calibration.py), y judged over each runtime's own codes (given_codes.py),
what the cache cost (cost.py), and the step's hooks (step.py)."""
