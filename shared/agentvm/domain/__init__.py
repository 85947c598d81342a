"""Plain models and rules: no I/O, no imports from the rest of the package."""
