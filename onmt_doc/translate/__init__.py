"""Translation: batched beam search, the streaming document translator, forced decoding."""
