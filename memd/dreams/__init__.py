"""Recall tracking and promotion of short-term memories ("dreaming")."""
