"""Model types transformers 5.23 ships whose attention needs what the layer lacks: each is
refused in one line naming what is missing (never "unsupported model type"), until it is built.
The list is ../shared/notes/families-transformers-5.23.md's, less what the registry reads."""
from __future__ import annotations

# model_type -> what its attention needs that the layer lacks
NOT_YET: dict[str, str] = {}
