"""Embedding providers behind one interface."""

from memd.embed.base import Embedder, Kind, Vectors, normalize
from memd.embed.fake import EmbedFailure, FakeEmbedder

__all__ = ["EmbedFailure", "Embedder", "FakeEmbedder", "Kind", "Vectors", "normalize"]
