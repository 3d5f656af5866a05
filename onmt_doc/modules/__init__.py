"""Building blocks shared by encoders and decoders."""
