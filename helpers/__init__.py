"""The small library behind the notebooks."""
