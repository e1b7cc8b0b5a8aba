// @ts-check
// OpenClaw memory-slot plugin: the agent's memory is served by the local memd daemon.
//
// memd watches and indexes the workspace's Markdown memory (MEMORY.md, memory/*.md, optionally
// session transcripts); this plugin is the thin part inside OpenClaw. It registers the
// memory_search and memory_get tools, the memory runtime OpenClaw's own features use (status,
// compaction, recall), the prompt section with the session-start context, the pre-compaction
// flush plan, and an `openclaw memory` command. Every rule (scopes, transcript visibility, the
// flush rules, time zones) is memd's: the plugin passes who is asking and shows the answer.

import { Code, MemdClient, MemdError } from "./src/client.js";
import { AgentWorkspace, MemdSearchManager, asMemdError, authorizeHits } from "./src/manager.js";
import { SessionMemory } from "./src/prompt.js";
import { createTools } from "./src/tools.js";

export const PLUGIN_ID = "memd";
const DEFAULT_CONTEXT_CHARS = 12_000;

/**
 * The plugin's settings (`configSchema` in openclaw.plugin.json).
 * @typedef {{ socket?: string, workspace?: string, timeoutMs?: number, autostart?: boolean,
 *   memctl?: string, contextChars?: number }} Settings
 */

/** @param {any} api OpenClaw's plugin API */
function register(api) {
  /** @type {Settings} */
  const settings = api.pluginConfig ?? {};
  const client = new MemdClient({
    socketPath: settings.socket,
    timeoutMs: settings.timeoutMs,
    autostart: settings.autostart,
    memctl: settings.memctl,
  });
  const log = api.logger ?? console;

  /** The memd workspace of an agent: the configured one, else the agent's own directory. */
  const workspaceOf = (/** @type {any} */ cfg, /** @type {string} */ agentId) => {
    if (settings.workspace) return String(settings.workspace);
    const config = cfg ?? api.runtime?.config?.current?.() ?? api.config;
    let dir;
    try {
      dir = api.runtime?.agent?.resolveAgentWorkspaceDir?.(config, agentId);
    } catch {
      dir = undefined;
    }
    dir = dir ?? config?.agents?.defaults?.workspace;
    if (!dir) {
      throw new MemdError(
        Code.UNKNOWN_WORKSPACE,
        `no workspace for agent ${agentId}: set agents.defaults.workspace, or the memd plugin's workspace`,
      );
    }
    return String(dir);
  };
  /** An agent's memd workspace; its own directory is registered with memd on first use. */
  const targetOf = (/** @type {any} */ cfg, /** @type {string} */ agentId) =>
    new AgentWorkspace(client, workspaceOf(cfg, agentId), { agentId, register: !settings.workspace });
  const resolve = (/** @type {string} */ agentId) => targetOf(undefined, agentId);

  /** @type {Map<string, MemdSearchManager>} */
  const managers = new Map();
  const runtime = {
    async getMemorySearchManager(/** @type {{ cfg?: any, agentId?: string, purpose?: string }} */ { cfg, agentId, purpose }) {
      const id = agentId || "main";
      let target;
      try {
        target = targetOf(cfg, id);
      } catch (err) {
        return { manager: null, error: asMemdError(err).message };
      }
      const key = `${id}\u0000${target.workspace}`;
      let manager = managers.get(key);
      const fresh = !manager;
      if (!manager) {
        manager = new MemdSearchManager(target);
        managers.set(key, manager);
      }
      if (fresh || purpose === "status" || purpose === "cli") await manager.refresh();
      const error = manager.lastError ? `${manager.lastError.message}` : undefined;
      return { manager, ...(error ? { error } : {}), debug: { backend: "builtin", purpose } };
    },
    resolveMemoryBackendConfig() {
      return { backend: "builtin" };
    },
    async authorizeSearchHits(/** @type {any} */ params) {
      return authorizeHits(params);
    },
    async closeMemorySearchManager(/** @type {{ agentId?: string }} */ { agentId }) {
      for (const key of managers.keys()) if (key.startsWith(`${agentId || "main"}\u0000`)) managers.delete(key);
    },
    async closeAllMemorySearchManagers() {
      managers.clear();
      client.close();
    },
  };

  const memory = new SessionMemory({
    resolve,
    contextChars: settings.contextChars ?? DEFAULT_CONTEXT_CHARS,
    log,
  });

  api.registerMemoryCapability({
    deterministicRecallToolName: "memory_search",
    promptBuilder: (/** @type {any} */ params) => memory.promptSection(params),
    flushPlanResolver: (/** @type {any} */ params) => memory.flushPlan(params),
    runtime,
  });
  api.on?.("before_prompt_build", async (/** @type {any} */ _event, /** @type {any} */ ctx) => {
    await memory.prepare(ctx ?? {});
  });
  api.registerTool((/** @type {any} */ ctx) => createTools(ctx ?? {}, resolve).search, { names: ["memory_search"] });
  api.registerTool((/** @type {any} */ ctx) => createTools(ctx ?? {}, resolve).get, { names: ["memory_get"] });
  api.registerCli(
    (/** @type {any} */ { program, config }) => registerCli(program, config, runtime, resolve),
    { descriptors: [{ name: "memory", description: "Search and inspect memory served by memd", hasSubcommands: true }] },
  );
}

/** `openclaw memory status|search|index|context`, served by memd. */
function registerCli(/** @type {any} */ program, /** @type {any} */ config, /** @type {any} */ runtime, /** @type {any} */ resolve) {
  // In --json mode OpenClaw sends console output to stderr: machine output goes to stdout here.
  const out = (/** @type {string} */ text) => process.stdout.write(text.endsWith("\n") ? text : `${text}\n`);
  const agentOf = (/** @type {any} */ opts) => opts.agent ?? defaultAgent(config);
  const managerOf = async (/** @type {string} */ agentId, /** @type {string} */ purpose) => {
    const { manager, error } = await runtime.getMemorySearchManager({ cfg: config, agentId, purpose });
    if (!manager) throw new Error(error ?? "memory is unavailable");
    return manager;
  };
  const fail = (/** @type {unknown} */ err) => {
    process.stderr.write(`memd: ${asMemdError(err).message}\n`);
    process.exitCode = 1;
  };
  const command = program.command("memory").description("Search and inspect memory served by memd");

  command
    .command("status")
    .description("Show memd's index of this agent's memory")
    .option("--agent <id>", "Agent id")
    .option("--json", "Print JSON")
    .action(async (/** @type {any} */ opts) => {
      const agentId = agentOf(opts);
      const manager = await managerOf(agentId, "status");
      const status = manager.status();
      if (opts.json) return out(JSON.stringify([{ agentId, status }], null, 2));
      out(`Memory Search (${agentId})`);
      out(`Provider: ${status.provider}${status.model ? ` · ${status.model}` : ""}`);
      out(`Workspace: ${status.workspaceDir}`);
      const memd = status.custom?.memd ?? {};
      if (memd.available === false) {
        out(`memd: unavailable: ${memd.error}`);
        process.exitCode = 1;
        return;
      }
      out(`Indexed: ${status.files} files · ${status.chunks} chunks · ${memd.pendingFiles ?? 0} pending${status.dirty ? " (catching up)" : ""}`);
      out(`Served by: memd ${memd.version ?? "?"} (pid ${memd.pid ?? "?"}) on ${memd.socket}`);
    });

  command
    .command("search")
    .description("Search this agent's memory")
    .argument("[query]")
    .option("--query <text>", "The query (instead of the argument)")
    .option("--agent <id>", "Agent id")
    .option("--max-results <n>", "At most n hits", (/** @type {string} */ v) => Number.parseInt(v, 10))
    .option("--min-score <x>", "Drop hits scoring below x", Number)
    .option("--json", "Print JSON")
    .action(async (/** @type {string | undefined} */ queryArg, /** @type {any} */ opts) => {
      const query = opts.query ?? queryArg;
      if (!query) return fail(new Error("missing search query"));
      const agentId = agentOf(opts);
      try {
        const manager = await managerOf(agentId, "cli");
        const results = await manager.search(query, {
          maxResults: opts.maxResults,
          minScore: opts.minScore,
          sessionKey: `agent:${agentId}:cli:direct:memory-search`,
        });
        if (opts.json) return out(JSON.stringify({ results }, null, 2));
        if (!results.length) return out("No matches.");
        for (const r of results) out(`${r.score.toFixed(3)} ${r.path}:${r.startLine}-${r.endLine}\n${r.snippet}\n`);
      } catch (err) {
        fail(err);
      }
    });

  command
    .command("index")
    .description("Bring memd's index of this agent's memory up to date")
    .option("--agent <id>", "Agent id")
    .option("--force", "Rebuild from scratch")
    .action(async (/** @type {any} */ opts) => {
      try {
        const manager = await managerOf(agentOf(opts), "cli");
        await manager.sync({ force: Boolean(opts.force), reason: "cli" });
        const status = manager.status();
        out(`Indexed: ${status.files} files · ${status.chunks} chunks`);
      } catch (err) {
        fail(err);
      }
    });

  command
    .command("context")
    .description("Print the session-start context memd gives this agent")
    .option("--agent <id>", "Agent id")
    .option("--session-key <key>", "As seen from this session (its chat type decides about MEMORY.md)")
    .option("--max-chars <n>", "Budget", (/** @type {string} */ v) => Number.parseInt(v, 10))
    .action(async (/** @type {any} */ opts) => {
      const agentId = agentOf(opts);
      try {
        const reply = await resolve(agentId).call("context", {
          max_chars: opts.maxChars,
          caller: { agent_id: agentId, ...(opts.sessionKey ? { session_key: opts.sessionKey } : {}) },
        });
        out(reply.text || `(no memory for ${reply.date})`);
      } catch (err) {
        fail(err);
      }
    });
}

/** The agent a command means when none is named: the only one configured, else "main". */
export function defaultAgent(/** @type {any} */ config) {
  const ids = Object.keys(config?.agents?.entries ?? {});
  return ids.length === 1 ? ids[0] : "main";
}

export default {
  id: PLUGIN_ID,
  name: "memd memory",
  description: "Long-term memory served by the local memd daemon",
  register,
};
