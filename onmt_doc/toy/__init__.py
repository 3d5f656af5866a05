"""The synthetic document-level toy corpus: generator and contrastive suite (tests, quickstart, docs)."""
