"""The single writer: one thread applies every index write of every workspace
(memd/writer/writer.py), with its jobs, its embedding steps between them and its rebuilds."""
