"""Weight-only quantized projections (--quantize) as ONNX Runtime's MatMulNBits: round to
nearest per block (rtn.py), a GGUF's own blocks kept (source.py, gguf_blocks.py), the spec an
artifact records (records.py), the function the file holds (reference.py), what quantizing cost
(cost.py), and the step's hooks (step.py)."""
