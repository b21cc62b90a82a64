"""What the notebooks use beyond training: figures, the NumPy all-reduce simulation, the
notebooks' own tools (normal form, student edition, grading) and their timings."""
