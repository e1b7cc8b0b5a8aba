"""Embedding throughput: raw llama-cpp-python against memd's whole indexing path.

Both embed the same texts of the LoCoMo workspaces (each chunk and the lines that get vectors
of their own) with the same model and thread count. The raw figure is Llama.embed over those
texts in batches; memd's is a full first index of the
workspaces (discovery, chunking with exact token counts, embedding through the worker, SQLite
writes) from an empty state, so no vector comes from the cache.

    python bench/embed_throughput.py [--model PATH] [--threads 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from memd.config import Config
from memd.embed.llama import LlamaEmbedder
from memd.embed.process import ProcessEmbedder
from memd.embed.queued import QueuedEmbedder
from memd.index.cache import EmbeddingCache
from memd.index.chunk import chunk_text, vector_lines
from memd.index.index import Index
from memd.index.sync import Syncer
from memd.markdown.discover import discover

sys.path.insert(0, str(Path(__file__).resolve().parent))
from socket_bench import SHARED, code_state, environment  # noqa: E402  (a sibling script)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    workspaces = sorted(p for p in Path(args.data).iterdir() if p.is_dir())

    # The texts memd will embed: chunks cut exactly as memd cuts them, and their lines.
    probe = ProcessEmbedder(args.model, threads=args.threads)
    texts: list[str] = []
    chunk_count = 0
    for ws in workspaces:
        for f in discover(ws).files:
            content = f.abs.read_text(encoding="utf-8")
            chunks = chunk_text(
                content, 400, 80, count_tokens=probe.count_tokens, max_tokens=probe.max_tokens
            )
            chunk_count += len(chunks)
            for c in chunks:
                texts.append(c.text)
                texts.extend(line for line, _ in vector_lines(c.text))
    texts = list(dict.fromkeys(texts))  # memd embeds each distinct text once
    tokens = sum(probe.count_tokens(t) for t in texts)
    probe.embed_batch(texts[:2])  # the settings that embed safely on this CPU (a crash is here)
    mode = probe.mode
    probe.close()

    raw = LlamaEmbedder(args.model, threads=args.threads, extra_bufts=mode.extra_bufts)
    llm = raw.load()
    llm.embed(texts[:4], truncate=False)  # warm up
    start = time.perf_counter()
    for i in range(0, len(texts), args.batch):
        llm.embed(texts[i : i + args.batch], normalize=True, truncate=False)
    raw_s = time.perf_counter() - start
    raw.close()

    with tempfile.TemporaryDirectory(prefix="memd-bench-") as home:
        config = Config.load(env={"MEMD_HOME": home})
        cache = EmbeddingCache(config.cache_path)
        embedder = QueuedEmbedder(
            ProcessEmbedder(args.model, threads=args.threads, batch_size=args.batch)
        )
        embedder.embed_query("warm up")
        embedded = 0
        start = time.perf_counter()
        for ws in workspaces:
            index = Index(config.index_dir / f"{ws.name}.sqlite")
            index.open()
            report = Syncer(index, ws, config=config.index, embedder=embedder, cache=cache).sync()
            embedded += report.embedded
            index.close()
        memd_s = time.perf_counter() - start
        embedder.close()
        cache.close()

    result = {
        **environment(),
        "code": code_state(),
        "model": Path(args.model).name,
        "threads": args.threads,
        "load_mode": mode.label,
        "chunks": chunk_count,
        "texts": len(texts),
        "tokens": tokens,
        "raw_seconds": round(raw_s, 2),
        "raw_texts_per_s": round(len(texts) / raw_s, 2),
        "memd_seconds": round(memd_s, 2),
        "memd_texts_embedded": embedded,
        "memd_texts_per_s": round(embedded / memd_s, 2),
        "memd_chunks_per_s": round(chunk_count / memd_s, 2),
        "ratio": round((embedded / memd_s) / (len(texts) / raw_s), 3),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if embedded == len(texts) else 1


if __name__ == "__main__":
    sys.exit(main())
