"""The derived SQLite index: one database per workspace plus a shared embedding cache."""
