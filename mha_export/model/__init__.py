"""The whole model around the attention layers (transformers, the optional ``model`` extra):
loading a checkpoint with its tokenizer, and capturing the layers' real inputs."""
