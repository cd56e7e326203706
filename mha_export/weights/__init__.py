"""Weight sources: ``source.load_source`` (the one loading path of export, check and bench),
plain state-dict files (``files``) and Hugging Face checkpoints (``huggingface``, one record per
model type in ``families``)."""
