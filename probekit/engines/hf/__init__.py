"""The transformers engine: model loading, the exact scorer and decoding on a Hugging Face model."""
