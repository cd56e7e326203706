"""Weight sources: plain state-dict files (``files``) and Hugging Face checkpoints
(``huggingface``, one record per model family in ``families``)."""
