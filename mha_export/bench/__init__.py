"""`mha-export bench`: the driver, the per-measurement worker process and the textbook
baselines."""
