"""Encoder–decoder models, their builder and the checkpoint format."""
