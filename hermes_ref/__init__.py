"""hermes-ref: a verifiable reference engine of an LLM agent's turn lifecycle."""

__version__ = "0.1.0"
