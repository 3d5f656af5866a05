"""The stage types (one module each); ``benchmarks/stage_types.py`` imports them all into ``STAGES``."""
