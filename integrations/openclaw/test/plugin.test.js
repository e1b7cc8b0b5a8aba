// @ts-check
// The plugin against a real running memd (started by memd's test suite, which sets
// MEMD_TEST_SOCKET to its socket and MEMD_TEST_WORKSPACE to a workspace holding:
//   MEMORY.md            "The staging cluster is called Orion."
//   memory/<today>.md    "- deploy freeze starts at noon"
// and MEMD_TEST_MEMCTL to a memctl, with which the plugin starts a memd of its own). OpenClaw's plugin API is stood in for by a recorder of what the plugin registers: the real
// OpenClaw runs the plugin in memd's end-to-end test.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";

import plugin from "../index.js";
import { MemdClient, MemdError } from "../src/client.js";

const SOCKET = process.env.MEMD_TEST_SOCKET;
const WORKSPACE = process.env.MEMD_TEST_WORKSPACE;
const MEMCTL = process.env.MEMD_TEST_MEMCTL;
if (!SOCKET || !WORKSPACE) throw new Error("run through memd's test suite: MEMD_TEST_SOCKET and MEMD_TEST_WORKSPACE");

const GROUP = "agent:main:telegram:group:42";
const DIRECT = "agent:main:telegram:dm:7";

/** Whether `pid` runs (a zombie awaiting its reaper does not). */
function isRunning(/** @type {number} */ pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

/**
 * What the plugin registered with OpenClaw.
 * @typedef {{ tools: Record<string, (ctx: any) => any>, capability: any,
 *   hooks: Record<string, (...args: any[]) => any>, cli: any, warnings?: string[] }} Registered
 */

/** Register the plugin on a recording stand-in for OpenClaw's API. */
function load(pluginConfig = {}, /** @type {Record<string, string>} */ dirs = {}) {
  /** @type {Registered} */
  const got = { tools: {}, capability: null, hooks: {}, cli: null };
  const api = {
    pluginConfig,
    config: { agents: { defaults: { workspace: WORKSPACE } } },
    logger: { warn: (/** @type {string} */ m) => (got.warnings ??= []).push(m), debug() {}, info() {} },
    runtime: { agent: { resolveAgentWorkspaceDir: (/** @type {any} */ _cfg, /** @type {string} */ id) => dirs[id] ?? WORKSPACE } },
    registerMemoryCapability: (/** @type {any} */ c) => (got.capability = c),
    registerTool: (/** @type {any} */ factory, /** @type {any} */ opts) => (got.tools[opts.names[0]] = factory),
    registerCli: (/** @type {any} */ fn) => (got.cli = fn),
    on: (/** @type {string} */ name, /** @type {any} */ fn) => (got.hooks[name] = fn),
  };
  plugin.register(api);
  return got;
}

/** @type {Registered[]} */
const plugins = [];
function loaded(config = {}, /** @type {Record<string, string>} */ dirs = {}) {
  const got = load({ socket: SOCKET, ...config }, dirs);
  plugins.push(got);
  return got;
}
after(async () => {
  for (const got of plugins) await got.capability.runtime.closeAllMemorySearchManagers();
});

describe("client", () => {
  test("calls memd and maps its errors", async () => {
    const client = new MemdClient({ socketPath: SOCKET });
    try {
      const hello = await client.call("hello", { client: "plugin-test" });
      assert.equal(hello.server, "memd");
      assert.ok(hello.methods.includes("context") && hello.methods.includes("flush_plan"));
      await assert.rejects(client.call("no_such_method"), (err) => err instanceof MemdError && err.kind === "UNKNOWN_METHOD");
      await assert.rejects(
        client.call("get", { workspace: WORKSPACE, path: "../outside.md" }),
        (err) => err instanceof MemdError && err.kind === "PATH_REFUSED" && !err.unavailable,
      );
      // The connection is dropped (as memd drops idle ones): the next call reconnects.
      client.socket?.destroy();
      assert.equal((await client.call("hello")).server, "memd");
    } finally {
      client.close();
    }
  });

  test("says memd is not running, and how to start it", async () => {
    const client = new MemdClient({ socketPath: path.join(os.tmpdir(), `no-memd-${process.pid}.sock`) });
    await assert.rejects(client.call("hello"), (err) => {
      assert.ok(err instanceof MemdError && err.kind === "NOT_RUNNING" && err.unavailable);
      assert.match(err.message, /memd is not running/);
      assert.match(err.message, /memd run/);
      assert.match(err.message, /MEMD_AUTOSTART is off/); // the suite runs with it off
      return true;
    });
  });

  test("starts memd when nothing listens: calls at once share one start", { skip: !MEMCTL && "MEMD_TEST_MEMCTL is not set" }, async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "memd-auto-"));
    const home = path.join(dir, "home");
    const saved = process.env.MEMD_HOME;
    process.env.MEMD_HOME = home; // the memd it starts has a state of its own
    const client = new MemdClient({ socketPath: path.join(dir, "memd.sock"), autostart: true, memctl: MEMCTL });
    /** @type {number | undefined} */
    let pid;
    try {
      const hellos = await Promise.all([1, 2, 3, 4, 5].map(() => client.call("hello", {}, { timeoutMs: 120_000 })));
      pid = hellos[0].pid;
      assert.ok(hellos.every((h) => h.pid === pid));
      assert.equal(hellos[0].started.how, "on demand");
      assert.match(hellos[0].started.by, /^openclaw \(pid \d+\)$/);
    } finally {
      client.close();
      if (saved === undefined) delete process.env.MEMD_HOME;
      else process.env.MEMD_HOME = saved;
      if (pid) {
        process.kill(pid, "SIGTERM");
        for (let i = 0; i < 600 && isRunning(pid); i++) await new Promise((r) => setTimeout(r, 100));
      }
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test("says why memd could not be started", async () => {
    const client = new MemdClient({
      socketPath: path.join(os.tmpdir(), `no-memd-${process.pid}.sock`),
      autostart: true,
      memctl: path.join(os.tmpdir(), "no-such-memctl"),
    });
    await assert.rejects(client.call("hello"), (err) => {
      assert.ok(err instanceof MemdError && err.kind === "NOT_RUNNING");
      assert.match(err.message, /no-such-memctl was not found to start it/);
      return true;
    });
  });

  test("an idle connection does not keep a process alive", () => {
    const script =
      `const { MemdClient } = await import(${JSON.stringify(new URL("../src/client.js", import.meta.url).href)});` +
      `const c = new MemdClient({ socketPath: ${JSON.stringify(SOCKET)} });` +
      `console.log((await c.call("hello")).server);`;
    const run = spawnSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8", timeout: 60_000 });
    assert.equal(run.signal, null, "the process had to be killed: the connection held it");
    assert.equal(run.status, 0, run.stderr);
    assert.equal(run.stdout.trim(), "memd");
  });

  test("times out a call that gets no answer, and recovers", async () => {
    // A socket that accepts and never answers (a hung daemon cannot be made to order).
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "memd-hang-"));
    const sock = path.join(dir, "s");
    const server = net.createServer(() => {});
    await new Promise((resolve) => server.listen(sock, () => resolve(undefined)));
    const client = new MemdClient({ socketPath: sock, timeoutMs: 200 });
    try {
      await assert.rejects(client.call("hello"), (err) => err instanceof MemdError && err.kind === "TIMEOUT");
      assert.equal(client.socket, null, "a timed-out connection is not reused");
    } finally {
      client.close();
      server.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("memory runtime", () => {
  test("search, readFile and status come from memd", async () => {
    const { capability } = loaded();
    const { manager, error } = await capability.runtime.getMemorySearchManager({ cfg: {}, agentId: "main", purpose: "status" });
    assert.equal(error, undefined);
    const hits = await manager.search("staging cluster Orion", { sessionKey: DIRECT });
    assert.equal(hits[0].path, "MEMORY.md");
    assert.equal(hits[0].source, "memory");
    assert.equal(hits[0].citation, `MEMORY.md#L${hits[0].startLine}-L${hits[0].endLine}`);
    assert.match(hits[0].snippet, /Orion/);
    const read = await manager.readFile({ relPath: "MEMORY.md", from: 3, lines: 1 });
    assert.deepEqual(read, { status: "ok", text: "The staging cluster is called Orion.", path: "MEMORY.md", from: 3, lines: 1 });
    const missing = await manager.readFile({ relPath: "memory/1999-01-01.md" });
    assert.equal(missing.status, "not_found");
    const status = manager.status();
    assert.equal(status.backend, "builtin");
    assert.equal(status.workspaceDir, fs.realpathSync(WORKSPACE));
    assert.ok(status.files >= 2 && status.chunks >= 2, JSON.stringify(status));
    assert.equal(status.custom.memd.available, true);
    assert.equal(status.custom.memd.socket, SOCKET);
  });

  test("an agent's own workspace is registered with memd on first use", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "memd-agent-"));
    fs.mkdirSync(path.join(dir, "memory"));
    fs.writeFileSync(path.join(dir, "MEMORY.md"), "# Memory\n\nThe fresh agent likes kites.\n");
    const client = new MemdClient({ socketPath: SOCKET });
    try {
      const known = async () => (await client.call("workspace_list")).workspaces.map((/** @type {any} */ w) => w.path);
      assert.ok(!(await known()).includes(fs.realpathSync(dir)));
      const { tools } = loaded({}, { fresh: dir });
      const found = await tools.memory_search({ agentId: "fresh" }).execute("c", { query: "kites" });
      assert.equal(found.details.results[0]?.path, "MEMORY.md", found.content[0].text);
      assert.ok((await known()).includes(fs.realpathSync(dir)));
      await client.call("workspace_remove", { workspace: dir });
      // A workspace named in the plugin's settings is memd's to know: never registered here.
      const named = loaded({ workspace: dir }, {});
      const refused = await named.tools.memory_search({ agentId: "fresh" }).execute("c", { query: "kites" });
      assert.match(refused.details.error, /not a registered workspace/);
    } finally {
      client.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test("a group chat does not get MEMORY.md", async () => {
    const { capability } = loaded();
    const { manager } = await capability.runtime.getMemorySearchManager({ cfg: {}, agentId: "main" });
    const hits = await manager.search("staging cluster Orion", { sessionKey: GROUP });
    assert.deepEqual(hits.filter((/** @type {{ path: string }} */ h) => h.path === "MEMORY.md"), []);
  });

  test("status says memd is not running and how to start it", async () => {
    const { capability } = loaded({ socket: path.join(os.tmpdir(), `no-memd-${process.pid}.sock`) });
    const { manager, error } = await capability.runtime.getMemorySearchManager({ cfg: {}, agentId: "main", purpose: "status" });
    assert.match(error, /memd is not running/);
    const status = manager.status();
    assert.equal(status.custom.memd.available, false);
    assert.match(status.custom.memd.action, /memd run/);
    assert.equal((await manager.probeEmbeddingAvailability()).ok, false);
  });
});

describe("tools", () => {
  test("memory_search and memory_get answer with text and details", async () => {
    const { tools } = loaded();
    const search = tools.memory_search({ agentId: "main", sessionKey: DIRECT });
    assert.deepEqual(search.parameters.required, ["query"]);
    const found = await search.execute("call-1", { query: "deploy freeze", maxResults: 3 });
    const hit = found.details.results[0];
    assert.match(hit.path, /^memory\/\d{4}-\d{2}-\d{2}\.md$/);
    assert.match(found.content[0].text, /^1 memory hit\(s\) for "deploy freeze":/);
    assert.ok(found.content[0].text.includes(hit.citation));
    const get = tools.memory_get({ agentId: "main", sessionKey: DIRECT });
    const cited = await get.execute("call-2", { path: "MEMORY.md#L3-L3" });
    assert.equal(cited.details.text, "The staging cluster is called Orion.");
    assert.equal(cited.content[0].text, "MEMORY.md#L3-L3:\nThe staging cluster is called Orion.");
  });

  test("a caller mistake is an error to act on, not 'memory disabled'", async () => {
    const { tools } = loaded();
    const refused = await tools.memory_get({ agentId: "main" }).execute("c", { path: "../secrets.md" });
    assert.equal(refused.details.disabled, undefined);
    assert.match(refused.content[0].text, /path refused/);
    assert.match(refused.content[0].text, /Use a path from a memory_search hit/);
    const group = await tools.memory_get({ agentId: "main", sessionKey: GROUP }).execute("c", { path: "MEMORY.md" });
    assert.match(group.details.error, /long-term memory is not available in this chat/);
  });

  test("memory that is unavailable is said so, never thrown", async () => {
    const { tools } = loaded({ socket: path.join(os.tmpdir(), `no-memd-${process.pid}.sock`) });
    const found = await tools.memory_search({ agentId: "main" }).execute("c", { query: "anything" });
    assert.deepEqual(found.details.results, []);
    assert.equal(found.details.disabled, true);
    assert.equal(found.details.unavailable, true);
    assert.match(found.content[0].text, /^Memory is unavailable: memd is not running/);
    assert.match(found.details.action, /memd run/);
  });
});

describe("prompt and flush plan", () => {
  test("the prompt section carries the session-start context, under the caller's scope", async () => {
    const { capability, hooks } = loaded();
    const tools = new Set(["memory_search", "memory_get"]);
    await hooks.before_prompt_build({}, { agentId: "main", sessionKey: DIRECT, sessionId: "s1" });
    const direct = capability.promptBuilder({ availableTools: tools, agentId: "main", agentSessionKey: DIRECT }).join("\n");
    assert.match(direct, /^## Memory Recall/);
    assert.match(direct, /## Long-term memory: MEMORY\.md#L1-L3\n# Memory/);
    assert.match(direct, /deploy freeze starts at noon/);
    await hooks.before_prompt_build({}, { agentId: "main", sessionKey: GROUP, sessionId: "s2" });
    const group = capability.promptBuilder({ availableTools: tools, agentId: "main", agentSessionKey: GROUP }).join("\n");
    assert.doesNotMatch(group, /Orion/);
    assert.match(group, /deploy freeze starts at noon/);
    assert.deepEqual(capability.promptBuilder({ availableTools: new Set(), agentId: "main" }), []);
  });

  test("the flush plan is memd's, with OpenClaw's overrides and window cap", async () => {
    const { capability, hooks } = loaded();
    assert.equal(capability.flushPlanResolver({}), null, "no plan before memd gave one");
    await hooks.before_prompt_build({}, { agentId: "main", sessionKey: DIRECT, sessionId: "s1" });
    const plan = capability.flushPlanResolver({});
    assert.equal(plan.softThresholdTokens, 4000);
    assert.equal(plan.forceFlushTranscriptBytes, 2 * 1024 * 1024);
    assert.equal(plan.reserveTokensFloor, 20000);
    assert.match(plan.relativePath, /^memory\/\d{4}-\d{2}-\d{2}\.md$/);
    assert.ok(plan.prompt.includes(plan.relativePath) && plan.prompt.includes("NO_REPLY"));
    assert.match(plan.systemPrompt, /read-only/);
    const small = capability.flushPlanResolver({ contextWindowTokens: 32000 });
    assert.equal(small.reserveTokensFloor, 8000);
    assert.equal(small.softThresholdTokens, 4000);
    assert.equal(capability.flushPlanResolver({ contextWindowTokens: 8000 }).softThresholdTokens, 3000);
    const off = { agents: { defaults: { compaction: { memoryFlush: { enabled: false } } } } };
    assert.equal(capability.flushPlanResolver({ cfg: off }), null);
  });
});
