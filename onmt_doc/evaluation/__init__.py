"""Evaluation metrics and analysis."""
