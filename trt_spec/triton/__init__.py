"""The Triton side: tensor specs (defined once), config builders, the repository writer, the
model sources, and the server launcher."""
