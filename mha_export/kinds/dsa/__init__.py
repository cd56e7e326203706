"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5's DSA layers): a lightning indexer on top of
Multi-head Latent Attention picks each query's top-k keys; the others are masked. settings.py
(torch-free), indexer.py (eager), graph.py (ONNX); kinds/mla/ builds the layer around them."""
