"""A package whose functions import relatively inside their bodies (tests/test_relative_imports.py)."""
