"""Export targets: one package and one record each (registry.py)."""
