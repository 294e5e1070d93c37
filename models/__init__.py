"""Encoder, blocks and heads shared by every attention variant."""
