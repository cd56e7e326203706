"""Weight-only quantized projections (--quantize) as ONNX Runtime's MatMulNBits: round to
nearest per block (rtn.py), a checkpoint's own weights kept (source.py, gguf_blocks.py,
checkpoint_blocks.py; each a weight of kept.py's protocol), the spec an artifact records
(records.py), the function the file holds (reference.py), what quantizing cost (cost.py), and
the step's hooks (step.py)."""
