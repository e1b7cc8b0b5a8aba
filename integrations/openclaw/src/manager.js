// @ts-check
// OpenClaw's MemorySearchManager, answered by memd: one manager per agent, one memd workspace each.

import { MemdError, START_HINT } from "./client.js";

/** @typedef {ReturnType<typeof toSearchResult>} SearchResult OpenClaw's MemorySearchResult */

/** memd's search hit -> OpenClaw's MemorySearchResult. */
export function toSearchResult(/** @type {any} */ hit) {
  const startLine = Number(hit.start_line);
  const endLine = Number(hit.end_line);
  return {
    path: String(hit.path),
    startLine,
    endLine,
    score: Number(hit.score ?? 0),
    vectorScore: hit.vector_score ?? undefined,
    textScore: hit.text_score ?? undefined,
    snippet: String(hit.snippet ?? ""),
    source: hit.source === "sessions" ? "sessions" : "memory",
    citation: `${hit.path}#L${startLine}-L${endLine}`,
  };
}

/** OpenClaw's `sources` (["memory"], ["sessions"], both) -> memd's `sources` (omitted = all). */
export function toMemdSources(/** @type {string[] | undefined} */ sources) {
  if (!sources || sources.length === 0) return undefined;
  const wanted = new Set(sources);
  if (wanted.has("memory") && wanted.has("sessions")) return undefined;
  return [...wanted].filter((s) => s === "memory" || s === "sessions");
}

/** Who is asking, as memd's caller map: the session key tells memd the agent and chat type. */
export function callerOf(/** @type {string | undefined} */ agentId, /** @type {string | undefined} */ sessionKey) {
  /** @type {Record<string, string>} */
  const caller = {};
  if (agentId) caller.agent_id = agentId;
  if (sessionKey) caller.session_key = sessionKey;
  return Object.keys(caller).length ? caller : undefined;
}

/** The agent a session key belongs to (`agent:<id>:…`), if it says. */
export function agentOfSessionKey(/** @type {string | undefined} */ sessionKey) {
  const parts = (sessionKey ?? "").split(":");
  return parts.length >= 2 && parts[0] === "agent" ? parts[1] : undefined;
}

/**
 * memd's visibility rule for OpenClaw's authorizeSearchHits: memory hits pass; a transcript hit
 * passes only to a requester of the same agent (known from its session key), never when
 * sandboxed and never when the requester says nothing.
 * @template {{ source?: string }} Hit
 * @param {{ agentId?: string, requesterSessionKey?: string, sandboxed?: boolean, hits: Hit[] }} params
 * @returns {Hit[]}
 */
export function authorizeHits({ agentId, requesterSessionKey, sandboxed, hits }) {
  const requester = agentOfSessionKey(requesterSessionKey);
  return hits.filter((hit) => {
    if (hit.source !== "sessions") return true;
    return !sandboxed && requester !== undefined && requester === agentId;
  });
}

const EMPTY_STATUS_FIELDS = { files: 0, chunks: 0, dirty: true };

/**
 * One agent's memd workspace: calls name it, and an agent's own workspace directory that memd
 * does not know yet is registered on first use (a configured workspace name never is).
 */
export class AgentWorkspace {
  /**
   * @param {import("./client.js").MemdClient} client
   * @param {string} workspace a memd workspace name or an absolute directory
   * @param {{ agentId: string, register: boolean }} options
   */
  constructor(client, workspace, { agentId, register }) {
    this.client = client;
    this.workspace = workspace;
    this.agentId = agentId;
    this.register = register;
  }

  /** Call `method` for this workspace; resolves to memd's result or rejects with MemdError. */
  async call(/** @type {string} */ method, /** @type {Record<string, unknown>} */ params = {}, /** @type {import("./client.js").CallOptions} */ options = {}) {
    const body = { workspace: this.workspace, ...params };
    try {
      return await this.client.call(method, body, options);
    } catch (err) {
      if (!(this.register && err instanceof MemdError && err.kind === "UNKNOWN_WORKSPACE")) throw err;
      await this.client.call("workspace_add", { path: this.workspace, agent_id: this.agentId });
      return await this.client.call(method, body, options);
    }
  }
}

export class MemdSearchManager {
  /** @param {AgentWorkspace} target */
  constructor(target) {
    this.target = target;
    this.agentId = target.agentId;
    this.workspaceDir = target.workspace.startsWith("/") ? target.workspace : undefined;
    /** @type {any} memd's last status of this workspace, or null */
    this.memdStatus = null;
    /** @type {MemdError | null} */
    this.lastError = null;
  }

  /** Fetch memd's status of this workspace (status() is synchronous and reports this copy). */
  async refresh() {
    try {
      const reply = await this.target.call("status");
      this.memdStatus = { daemon: reply.daemon, ...(reply.workspaces?.[0] ?? {}) };
      this.lastError = null;
    } catch (err) {
      this.lastError = asMemdError(err);
    }
    return this;
  }

  /**
   * @param {string} query
   * @param {{ maxResults?: number, minScore?: number, sources?: string[], lexicalOnly?: boolean,
   *   sessionKey?: string, signal?: AbortSignal }} [opts]
   * @returns {Promise<SearchResult[]>}
   */
  async search(query, opts = {}) {
    const reply = await this.target.call(
      "search",
      {
        query,
        max_results: opts.maxResults,
        min_score: opts.minScore,
        sources: toMemdSources(opts.sources),
        mode: opts.lexicalOnly ? "keyword" : undefined,
        caller: callerOf(this.agentId, opts.sessionKey),
      },
      { signal: opts.signal },
    );
    return (reply.results ?? []).map(toSearchResult);
  }

  async readFile(/** @type {{ relPath: string, from?: number, lines?: number }} */ params) {
    const reply = await this.target.call("get", {
      path: params.relPath,
      from: params.from,
      lines: params.lines,
      caller: callerOf(this.agentId, undefined),
    });
    if (reply.missing) return { status: "not_found", text: "", path: String(reply.path) };
    return {
      status: "ok",
      text: String(reply.text ?? ""),
      path: String(reply.path),
      from: reply.from,
      lines: reply.lines,
      ...(reply.truncated ? { truncated: true, nextFrom: reply.next_from ?? undefined } : {}),
    };
  }

  /** OpenClaw's MemoryProviderStatus, from the last status memd gave (see refresh). */
  status() {
    const base = { backend: "builtin", workspaceDir: this.workspaceDir };
    const st = this.memdStatus;
    if (!st) {
      const why = this.lastError?.message ?? "memd has not been asked yet";
      return {
        ...base,
        ...EMPTY_STATUS_FIELDS,
        provider: "memd",
        lastSyncError: why,
        custom: { memd: { available: false, error: why, action: START_HINT } },
      };
    }
    const provider = st.provider ?? {};
    const active = provider.active ?? "none";
    const vectors = st.vector_store ?? {};
    return {
      ...base,
      workspaceDir: st.root ?? this.workspaceDir,
      provider: active === "none" ? "memd (keyword-only)" : `memd/${active}`,
      model: provider.model || undefined,
      requestedProvider: provider.requested,
      files: st.files_indexed ?? 0,
      chunks: st.chunks ?? 0,
      dirty: Boolean(st.dirty),
      lastSyncError: provider.last_error ?? this.lastError?.message ?? undefined,
      sources: st.sessions_dir ? ["memory", "sessions"] : ["memory"],
      fts: { enabled: true, available: true },
      vector: {
        enabled: active !== "none",
        available: Boolean(vectors.sqlite_vec) && active !== "none",
        dims: provider.dims || undefined,
        ...(vectors.reason ? { loadError: vectors.reason } : {}),
      },
      cache: { enabled: true, entries: st.cache_entries ?? undefined },
      custom: {
        memd: {
          available: this.lastError === null,
          workspace: st.workspace,
          version: st.daemon?.version,
          pid: st.daemon?.pid,
          socket: this.target.client.socketPath,
          pendingFiles: st.files_pending ?? 0,
          vectors: st.vectors ?? 0,
          freshness: st.freshness,
        },
      },
    };
  }

  async sync(/** @type {{ force?: boolean, reason?: string }} */ params = {}) {
    await this.target.call(
      "reindex",
      { force: Boolean(params.force), wait: true },
      { timeoutMs: 0 }, // a full reindex takes as long as it takes; memd reports progress in status
    );
    await this.refresh();
  }

  getCachedEmbeddingAvailability() {
    return this.memdStatus ? this.embeddingProbe() : null;
  }

  async probeEmbeddingAvailability() {
    await this.refresh();
    return this.embeddingProbe();
  }

  embeddingProbe() {
    if (!this.memdStatus) return { ok: false, checked: true, error: this.lastError?.message ?? "memd is unavailable" };
    const provider = this.memdStatus.provider ?? {};
    if ((provider.active ?? "none") === "none") {
      const skipped = (provider.skipped ?? []).map((/** @type {{ provider: string, reason: string }} */ s) => `${s.provider}: ${s.reason}`).join("; ");
      return { ok: false, checked: true, error: `keyword-only: no embedding provider${skipped ? ` (${skipped})` : ""}` };
    }
    return { ok: true, checked: true };
  }

  async probeVectorAvailability() {
    await this.refresh();
    const st = this.memdStatus;
    return Boolean(st && st.vector_store?.sqlite_vec && (st.provider?.active ?? "none") !== "none");
  }

  async close() {}
}

/** @returns {MemdError} */
export function asMemdError(/** @type {unknown} */ err) {
  if (err instanceof MemdError) return err;
  return new MemdError("UNAVAILABLE", err instanceof Error ? err.message : String(err));
}
