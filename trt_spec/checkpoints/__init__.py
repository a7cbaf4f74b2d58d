"""Hugging Face checkpoints: their configs, download, pair checks and conversion."""
