"""Translation: batched search (beam, greedy), the streaming document translator, forced decoding."""
