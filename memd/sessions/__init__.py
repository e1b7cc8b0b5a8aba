"""Agent session transcripts as a second memory source: file names, rendering, raw line windows."""

from memd.sessions.jsonl import JsonlWindow, read_jsonl_lines
from memd.sessions.transcript import (
    DREAMING_PREFIX,
    Rendered,
    TranscriptFile,
    is_archived,
    is_transcript_name,
    list_transcripts,
    map_lines,
    render,
)

__all__ = [
    "DREAMING_PREFIX",
    "JsonlWindow",
    "Rendered",
    "TranscriptFile",
    "is_archived",
    "is_transcript_name",
    "list_transcripts",
    "map_lines",
    "read_jsonl_lines",
    "render",
]
