"""Export: the eager layer -> an artifact folder (model file + config.json + source weights)."""
