"""servedeck: run LLM inference servers on your own GPUs, and measure them honestly."""

__version__ = "0.1.0"
