"""trainguard: GPU training runs where a failure costs minutes, not days."""

__version__ = "0.1.0"
