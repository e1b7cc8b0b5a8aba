// @ts-check
// The plugin's parts that need no memd: error mapping, socket paths, result shaping, prompt
// building, citation parsing. Nothing here connects to a daemon or starts one (the clients made
// here have autostart off and point at sockets nobody listens on).

import assert from "node:assert/strict";
import os from "node:os";
import path from "node:path";
import { describe, test } from "node:test";

import plugin, { defaultAgent } from "../index.js";
import {
  Code,
  MemdClient,
  MemdError,
  autostartEnabled,
  defaultSocketPath,
  errorFromWire,
  posixPath,
} from "../src/client.js";
import {
  AgentWorkspace,
  MemdSearchManager,
  agentOfSessionKey,
  asMemdError,
  authorizeHits,
  callerOf,
  toMemdSources,
  toSearchResult,
} from "../src/manager.js";
import { SessionMemory, recallSection } from "../src/prompt.js";
import { actionFor, failure, searchText, sourcesOfCorpus, splitCitation } from "../src/tools.js";

const NOWHERE = path.join(os.tmpdir(), `no-memd-units-${process.pid}.sock`);
const NO_USER = "~no-such-user-for-memd";

/** A client that never reaches a daemon. */
const offline = () => new MemdClient({ socketPath: NOWHERE, autostart: false });

/** Run `fn` with process.env replaced by `env`, then put it back. */
async function withEnv(/** @type {NodeJS.ProcessEnv} */ env, /** @type {() => unknown} */ fn) {
  const saved = process.env;
  process.env = env;
  try {
    return await fn();
  } finally {
    process.env = saved;
  }
}

/** @param {string} kind @returns {(err: unknown) => boolean} */
const isKind = (kind) => (err) => err instanceof MemdError && err.kind === kind;

describe("errors", () => {
  test("a wire code is named by its kind; a local kind has no number", () => {
    assert.ok(Object.isFrozen(Code));
    for (const [name, value] of Object.entries(Code)) {
      const err = new MemdError(value, "x");
      assert.equal(err.kind, name);
      assert.equal(err.code, value);
      assert.equal(err.unavailable, false, name);
    }
    assert.equal(new MemdError(99, "x").kind, "CODE_99");
    assert.equal(new MemdError("NOT_RUNNING", "x").unavailable, true);
    assert.equal(new MemdError("UNAVAILABLE", "x").unavailable, true);
  });

  test("wire errors are read as memd_client reads them", () => {
    const refused = errorFromWire([Code.PATH_REFUSED, "path refused: ../x.md"]);
    assert.ok(refused instanceof MemdError);
    assert.equal(refused.kind, "PATH_REFUSED");
    assert.equal(refused.message, "path refused: ../x.md");
    assert.equal(errorFromWire([42, "new"]).kind, "CODE_42");
    assert.equal(errorFromWire([Code.BUSY, 7]).message, "7");
    for (const code of ["5", 5.5, true, null]) assert.equal(errorFromWire([code, "m"]).kind, "INTERNAL", String(code));
    for (const shape of ["boom", [5], [5, "m", "extra"], {}, 0, false]) {
      const err = errorFromWire(shape);
      assert.equal(err.kind, "INTERNAL", JSON.stringify(shape));
      assert.match(err.message, /^malformed error from memd: /);
    }
  });

  test("anything thrown becomes a MemdError that says it", () => {
    const own = new MemdError(Code.BUSY, "busy");
    assert.equal(asMemdError(own), own);
    const err = asMemdError(new TypeError("bad thing"));
    assert.equal(err.kind, "UNAVAILABLE");
    assert.equal(err.message, "bad thing");
    assert.equal(asMemdError("plain").message, "plain");
  });
});

describe("client settings", () => {
  test("MEMD_AUTOSTART turns starting memd off", () => {
    for (const off of ["0", "false", "no", "off", " OFF ", "No", "\t0\n"]) {
      assert.equal(autostartEnabled({ MEMD_AUTOSTART: off }), false, JSON.stringify(off));
    }
    for (const on of [undefined, "", "1", "yes", "true", "o"]) {
      assert.equal(autostartEnabled({ MEMD_AUTOSTART: on }), true, JSON.stringify(on));
    }
  });

  test("the socket is where memd puts it", () => {
    const home = "/home/ann";
    const at = (/** @type {NodeJS.ProcessEnv} */ env, platform = /** @type {NodeJS.Platform} */ ("linux")) =>
      defaultSocketPath({ HOME: home, ...env }, platform);
    assert.equal(at({}), "/home/ann/.local/state/memd/run/memd.sock");
    assert.equal(at({ MEMD_SOCKET: "/tmp/m.sock", MEMD_HOME: "/m" }), "/tmp/m.sock");
    assert.equal(at({ MEMD_SOCKET: "~/m.sock" }), "/home/ann/m.sock");
    assert.equal(at({ MEMD_SOCKET: "", MEMD_HOME: "~/memd/" }), "/home/ann/memd/run/memd.sock");
    assert.equal(at({ MEMD_HOME: "/m", XDG_RUNTIME_DIR: "/run/user/1" }), "/m/run/memd.sock");
    assert.equal(at({ XDG_RUNTIME_DIR: "/run/user/1", XDG_STATE_HOME: "/s" }), "/run/user/1/memd/memd.sock");
    assert.equal(at({ XDG_RUNTIME_DIR: "", XDG_STATE_HOME: "/s" }), "/s/memd/run/memd.sock");
    assert.equal(at({ HOME: "" }), "/.local/state/memd/run/memd.sock");
    assert.equal(at({ HOME: "/home/ann/" }), "/home/ann/.local/state/memd/run/memd.sock");
    // A ".." is kept, as memd keeps it: a symlink before it decides where it leads.
    assert.equal(at({ MEMD_HOME: "/a/../b" }), "/a/../b/run/memd.sock");
    assert.equal(at({ MEMD_SOCKET: "//srv//memd/./m.sock/" }), "//srv/memd/m.sock");
    assert.equal(at({}, "darwin"), "/home/ann/Library/Application Support/memd/run/memd.sock");
    assert.equal(at({ XDG_CONFIG_HOME: "" }, "darwin"), "/home/ann/.local/state/memd/run/memd.sock");
    assert.equal(at({ XDG_RUNTIME_DIR: "/r" }, "darwin"), "/r/memd/memd.sock");
  });

  test("~ and ~user are home directories", () => {
    const me = os.userInfo();
    assert.equal(defaultSocketPath({ MEMD_SOCKET: `~${me.username}/m.sock` }), posixPath(me.homedir, "m.sock"));
    assert.equal(defaultSocketPath({ MEMD_SOCKET: "~" }), posixPath(me.homedir));
    assert.equal(defaultSocketPath({}), posixPath(me.homedir, ".local/state/memd/run/memd.sock"));
  });

  test("paths are written as memd writes them", () => {
    assert.equal(posixPath("/a//b/./c/"), "/a/b/c");
    assert.equal(posixPath("a", "./b", ""), "a/b");
    assert.equal(posixPath("/a", "/b", "c"), "/b/c");
    assert.equal(posixPath("//a"), "//a");
    assert.equal(posixPath("///a"), "/a");
    assert.equal(posixPath("/"), "/");
    assert.equal(posixPath("./"), ".");
    assert.equal(posixPath("a/../b"), "a/../b");
  });

  test("a home directory that cannot be found fails each call, naming the setting", async () => {
    assert.throws(
      () => defaultSocketPath({ MEMD_SOCKET: `${NO_USER}/m.sock` }),
      (/** @type {any} */ err) => isKind("CONFIG")(err) && err.message.includes(`MEMD_SOCKET is "${NO_USER}/m.sock"`),
    );
    assert.throws(() => defaultSocketPath({ MEMD_HOME: NO_USER }), /MEMD_HOME is/);
    await withEnv({ MEMD_SOCKET: `${NO_USER}/m.sock`, MEMD_AUTOSTART: "0" }, async () => {
      const client = new MemdClient(); // registering the plugin does not fail on it
      await assert.rejects(client.call("hello"), isKind("CONFIG"));
      const said = failure(await client.call("hello").catch((e) => e));
      assert.match(said.content[0].text, /its home directory cannot be found\. Fix the setting the error names/);
    });
  });

  test("a request over 1 MiB is refused before anything is sent", async () => {
    const client = offline();
    await assert.rejects(client.call("search", { query: "x".repeat(1 << 20) }), isKind("TOO_LARGE"));
    await assert.rejects(client.call("hello"), isKind("NOT_RUNNING"));
  });

  test("a closed client refuses calls", async () => {
    const client = offline();
    client.close();
    await assert.rejects(client.call("hello"), isKind("UNAVAILABLE"));
  });
});

describe("results", () => {
  test("memd's hit becomes OpenClaw's search result", () => {
    const hit = { path: "MEMORY.md", start_line: 3, end_line: 7, score: 0.5, vector_score: 0.25, text_score: null, snippet: "s", source: "memory" };
    assert.deepEqual(toSearchResult(hit), {
      path: "MEMORY.md",
      startLine: 3,
      endLine: 7,
      score: 0.5,
      vectorScore: 0.25,
      textScore: undefined,
      snippet: "s",
      source: "memory",
      citation: "MEMORY.md#L3-L7",
    });
    const bare = toSearchResult({ path: "sessions/a.jsonl", start_line: 1, end_line: 1, source: "sessions" });
    assert.equal(bare.score, 0);
    assert.equal(bare.snippet, "");
    assert.equal(bare.source, "sessions");
    assert.equal(toSearchResult({ path: "x.md", start_line: 1, end_line: 2, source: "wiki" }).source, "memory");
  });

  test("OpenClaw's sources become memd's", () => {
    assert.equal(toMemdSources(undefined), undefined);
    assert.equal(toMemdSources([]), undefined);
    assert.equal(toMemdSources(["sessions", "memory"]), undefined);
    assert.deepEqual(toMemdSources(["memory", "memory"]), ["memory"]);
    assert.deepEqual(toMemdSources(["sessions"]), ["sessions"]);
    assert.deepEqual(sourcesOfCorpus("wiki"), ["memory"]);
    assert.deepEqual(sourcesOfCorpus("memory"), ["memory"]);
    assert.deepEqual(sourcesOfCorpus("sessions"), ["sessions"]);
    assert.equal(sourcesOfCorpus("all"), undefined);
    assert.equal(sourcesOfCorpus(undefined), undefined);
  });

  test("who is asking, from the agent and its session key", () => {
    assert.deepEqual(callerOf("main", "agent:main:cli"), { agent_id: "main", session_key: "agent:main:cli" });
    assert.deepEqual(callerOf("main", undefined), { agent_id: "main" });
    assert.equal(callerOf(undefined, undefined), undefined);
    assert.equal(agentOfSessionKey("agent:work:telegram:dm:7"), "work");
    assert.equal(agentOfSessionKey("telegram:dm:7"), undefined);
    assert.equal(agentOfSessionKey("agent"), undefined);
    assert.equal(agentOfSessionKey(undefined), undefined);
  });

  test("transcript hits are shown only to their own agent", () => {
    const hits = [
      { path: "MEMORY.md", source: "memory" },
      { path: "sessions/a.jsonl", source: "sessions" },
    ];
    const direct = "agent:main:telegram:dm:7";
    /** @typedef {{ agentId: string, requesterSessionKey?: string, sandboxed: boolean }} Asked */
    const paths = (/** @type {Asked} */ p) => authorizeHits({ ...p, hits }).map((h) => h.path);
    assert.deepEqual(paths({ agentId: "main", requesterSessionKey: direct, sandboxed: false }), ["MEMORY.md", "sessions/a.jsonl"]);
    assert.deepEqual(paths({ agentId: "work", requesterSessionKey: direct, sandboxed: false }), ["MEMORY.md"]);
    assert.deepEqual(paths({ agentId: "main", requesterSessionKey: undefined, sandboxed: false }), ["MEMORY.md"]);
    assert.deepEqual(paths({ agentId: "main", requesterSessionKey: direct, sandboxed: true }), ["MEMORY.md"]);
  });

  test("status is shaped from memd's, and says when memd was not reached", () => {
    const manager = new MemdSearchManager(new AgentWorkspace(offline(), "/srv/agent", { agentId: "main", register: true }));
    const before = manager.status();
    assert.equal(before.workspaceDir, "/srv/agent");
    assert.equal(before.custom.memd.available, false);
    assert.equal(before.dirty, true);
    assert.equal(manager.getCachedEmbeddingAvailability(), null);
    manager.memdStatus = {
      daemon: { version: "1.2", pid: 4 },
      workspace: "agent",
      root: "/srv/agent-real",
      provider: { active: "fake", model: "m", requested: "auto", dims: 8 },
      vector_store: { sqlite_vec: true },
      files_indexed: 2,
      chunks: 5,
      files_pending: 1,
      sessions_dir: "/s",
    };
    /** @type {any} */
    const st = manager.status();
    assert.equal(st.provider, "memd/fake");
    assert.equal(st.workspaceDir, "/srv/agent-real");
    assert.deepEqual([st.files, st.chunks, st.dirty], [2, 5, false]);
    assert.deepEqual(st.sources, ["memory", "sessions"]);
    assert.deepEqual(st.vector, { enabled: true, available: true, dims: 8 });
    assert.equal(st.custom.memd.socket, NOWHERE);
    assert.equal(st.custom.memd.pendingFiles, 1);
    assert.deepEqual(manager.getCachedEmbeddingAvailability(), { ok: true, checked: true });
    manager.memdStatus.provider = { active: "none", skipped: [{ provider: "llama", reason: "no model" }] };
    manager.memdStatus.vector_store = { sqlite_vec: false, reason: "not loadable" };
    /** @type {any} */
    const keyword = manager.status();
    assert.equal(keyword.provider, "memd (keyword-only)");
    assert.deepEqual(keyword.vector, { enabled: false, available: false, dims: undefined, loadError: "not loadable" });
    assert.equal(manager.embeddingProbe().error, "keyword-only: no embedding provider (llama: no model)");
    const named = new MemdSearchManager(new AgentWorkspace(offline(), "agent", { agentId: "main", register: false }));
    assert.equal(named.workspaceDir, undefined);
  });
});

describe("prompt", () => {
  const unused = () => {
    throw new Error("memd is not asked here");
  };
  const tools = new Set(["memory_search", "memory_get"]);

  test("the recall instructions only with a memory tool, citations as set", () => {
    assert.deepEqual(recallSection(new Set(["exec"]), undefined), []);
    const on = recallSection(new Set(["memory_get"]), undefined);
    assert.equal(on[0], "## Memory Recall");
    assert.match(on.at(-1) ?? "", /^Citations: include Source/);
    assert.match(recallSection(tools, "off").at(-1) ?? "", /^Citations are disabled/);
  });

  test("the prompt section carries the context fetched for this session only", () => {
    const memory = new SessionMemory({ resolve: unused, contextChars: 100 });
    memory.remember(SessionMemory.key("main", "agent:main:dm:1"), { sessionId: "s", text: "## Long-term memory\nfacts" });
    const mine = memory.promptSection({ availableTools: tools, agentId: "main", agentSessionKey: "agent:main:dm:1" });
    assert.equal(mine.at(-2), "## Long-term memory\nfacts");
    assert.ok(mine.includes("## Memory at session start"));
    assert.equal(mine.at(-1), "");
    const other = memory.promptSection({ availableTools: tools, agentId: "main", agentSessionKey: "agent:main:dm:2" });
    assert.ok(!other.includes("## Memory at session start"));
    // No agent id is the main agent.
    assert.equal(SessionMemory.key(undefined, "k"), SessionMemory.key("main", "k"));
  });

  test("contexts of at most 256 sessions are kept, the least recently fetched go first", () => {
    const memory = new SessionMemory({ resolve: unused, contextChars: 100 });
    for (let i = 0; i < 256; i++) memory.remember(`k${i}`, { sessionId: undefined, text: `${i}` });
    memory.remember("k0", { sessionId: undefined, text: "again" });
    memory.remember("k256", { sessionId: undefined, text: "new" });
    assert.equal(memory.contexts.size, 256);
    assert.ok(memory.contexts.has("k0"));
    assert.ok(!memory.contexts.has("k1"));
  });

  test("the flush plan is memd's, with OpenClaw's overrides and window cap", () => {
    /** @type {string[]} */
    const warned = [];
    const memory = new SessionMemory({ resolve: unused, contextChars: 100, log: { warn: (m) => warned.push(m) } });
    assert.equal(memory.flushPlan({}), null);
    assert.match(warned[0], /no flush plan yet/);
    memory.plan = {
      at: Date.now(),
      plan: {
        soft_threshold_tokens: 4000,
        force_flush_transcript_bytes: 2048,
        prompt: "p",
        system_prompt: "sp",
        relative_path: "memory/2026-01-02.md",
      },
    };
    assert.deepEqual(memory.flushPlan(), {
      softThresholdTokens: 4000,
      forceFlushTranscriptBytes: 2048,
      reserveTokensFloor: 20000,
      prompt: "p",
      systemPrompt: "sp",
      relativePath: "memory/2026-01-02.md",
    });
    /** @param {any} memoryFlush @param {number} [window] */
    const flush = (memoryFlush, window) =>
      memory.flushPlan({ cfg: { agents: { defaults: { compaction: { memoryFlush } } } }, contextWindowTokens: window });
    assert.equal(flush({ enabled: false }), null);
    const over = flush({ softThresholdTokens: 100, forceFlushTranscriptBytes: 0, model: " small " });
    assert.deepEqual([over?.softThresholdTokens, over?.forceFlushTranscriptBytes, over?.model], [100, 0, "small"]);
    for (const bad of [-1, 1.5, "100", null]) {
      assert.equal(flush({ softThresholdTokens: bad })?.softThresholdTokens, 4000, String(bad));
    }
    const small = flush({}, 8000);
    assert.deepEqual([small?.reserveTokensFloor, small?.softThresholdTokens], [2000, 3000]);
    assert.equal(flush({}, -5)?.reserveTokensFloor, 20000);
  });
});

describe("tools", () => {
  test("citations split into a window; anything else is a path", () => {
    assert.deepEqual(splitCitation("MEMORY.md#L3-L7"), { path: "MEMORY.md", from: 3, lines: 5 });
    assert.deepEqual(splitCitation(" MEMORY.md#L3-7 "), { path: "MEMORY.md", from: 3, lines: 5 });
    assert.deepEqual(splitCitation("memory/a.md#L4"), { path: "memory/a.md", from: 4, lines: undefined });
    assert.deepEqual(splitCitation("a#b.md#L2-L2"), { path: "a#b.md", from: 2, lines: 1 });
    for (const plain of ["notes#1.md", "MEMORY.md#L0", "MEMORY.md#L5-L4", "MEMORY.md#L", "#L3", "MEMORY.md"]) {
      assert.deepEqual(splitCitation(plain), { path: plain }, plain);
    }
  });

  test("each error says what to do", () => {
    const action = (/** @type {number | "NOT_RUNNING" | "UNAVAILABLE"} */ code) => actionFor(new MemdError(code, "x"));
    assert.match(action("NOT_RUNNING"), /memd run/);
    for (const code of ["UNAVAILABLE", Code.BUSY, Code.TIMEOUT]) assert.match(action(/** @type {any} */ (code)), /retry/);
    assert.match(action(Code.UNKNOWN_WORKSPACE), /memctl workspace add/);
    assert.match(action(Code.PATH_REFUSED), /Use a path from a memory_search hit/);
    assert.match(action(Code.BAD_REQUEST), /arguments/);
    assert.match(action(Code.PROVIDER_UNAVAILABLE), /keyword search still works/);
    assert.match(action(Code.CONFIG), /Fix the setting/);
    assert.match(action(Code.INTERNAL), /memd's log/);
    assert.match(action(77), /memd's log/);
  });

  test("an error is a tool result; memory out of reach says it is unavailable", () => {
    const down = failure(new MemdError("NOT_RUNNING", "memd is not running."), { results: [] });
    assert.match(down.content[0].text, /^Memory is unavailable: memd is not running\. Start memd/);
    assert.deepEqual(Object.keys(down.details).sort(), ["action", "disabled", "error", "results", "unavailable"]);
    const refused = failure(new MemdError(Code.PATH_REFUSED, "path refused: ../x"), { path: "../x" });
    assert.equal(refused.content[0].text, "path refused: ../x. Use a path from a memory_search hit (MEMORY.md or memory/*.md).");
    assert.equal(refused.details.disabled, undefined);
    assert.equal(refused.details.path, "../x");
    assert.equal(failure(new MemdError(Code.UNKNOWN_WORKSPACE, "no")).details.unavailable, true);
    assert.match(failure(new Error("socket hang up")).content[0].text, /^Memory is unavailable: socket hang up\./);
  });

  test("search results as text", () => {
    assert.equal(searchText("q", { results: [] }), 'No memory matches "q".');
    const hit = toSearchResult({ path: "MEMORY.md", start_line: 1, end_line: 2, score: 0.456, snippet: "a\nb" });
    const text = searchText("q", { results: [hit], freshness: { fresh: false, pending_files: 3 }, note: "keyword-only" });
    assert.equal(
      text,
      '1 memory hit(s) for "q":\n\n1. MEMORY.md#L1-L2 (score 0.46)\n   a\n   b\n\n' +
        "(The index is catching up: 3 file(s) pending.)\n\nNote: keyword-only",
    );
  });
});

describe("plugin", () => {
  test("the agent a command means: the only one configured, else main", () => {
    assert.equal(defaultAgent({ agents: { entries: { work: {} } } }), "work");
    assert.equal(defaultAgent({ agents: { entries: { a: {}, b: {} } } }), "main");
    assert.equal(defaultAgent(undefined), "main");
  });

  test("an agent with no workspace is told how to set one, without asking memd", async () => {
    /** @type {any} */
    const got = { tools: {} };
    plugin.register({
      pluginConfig: { socket: NOWHERE, autostart: false },
      config: {},
      registerMemoryCapability: (/** @type {any} */ c) => (got.capability = c),
      registerTool: (/** @type {any} */ f, /** @type {any} */ o) => (got.tools[o.names[0]] = f),
      registerCli() {},
    });
    try {
      const { manager, error } = await got.capability.runtime.getMemorySearchManager({ agentId: "work" });
      assert.equal(manager, null);
      assert.match(error, /^no workspace for agent work: set agents\.defaults\.workspace/);
      const found = await got.tools.memory_search({ agentId: "work" }).execute("c", { query: "q" });
      assert.equal(found.details.unavailable, true);
      assert.match(found.details.action, /Register the workspace/);
    } finally {
      await got.capability.runtime.closeAllMemorySearchManagers();
    }
  });
});
