"""A float16 / bfloat16 file's rounded weights (--dtype) as a lossy step: the function the
file holds is the layer with its parameters rounded to that dtype (step.py), and what rounding
cost is reported apart from the runtimes' half-precision arithmetic (cost.py)."""
