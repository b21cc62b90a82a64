import sys
from pathlib import Path

# tests/workers.py holds worker functions that spawned processes import by name
sys.path.insert(0, str(Path(__file__).parent))
