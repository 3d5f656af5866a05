"""Thin command-line entry points; the logic lives in importable modules."""
