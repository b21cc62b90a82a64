"""Each notebook's measurements, one module per topic, built on ``helpers.training``."""
