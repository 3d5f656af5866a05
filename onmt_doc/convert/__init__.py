"""Converting checkpoints of other toolkits into onmt_doc checkpoints (OpenNMT-py 3.x Transformers)."""
