"""The Markdown memory files themselves: which files of a workspace are memory (discover), reading
windows of them (read, lines), and appending to the daily log without damaging it (append)."""
