"""Data pipeline: document files → subwords → ids → instances → token-budget batches."""
