// @ts-check
// The memory_search and memory_get tools an agent calls, answered by memd. A failure is a tool
// result that says what went wrong and what to do, never a thrown error.

import { START_HINT } from "./client.js";
import { asMemdError, callerOf, toMemdSources, toSearchResult } from "./manager.js";

export const SEARCH_DESCRIPTION =
  "Search long-term memory (MEMORY.md, memory/*.md daily notes and, if visible, past session " +
  "transcripts) by meaning and keywords. Use it BEFORE answering anything about prior work, " +
  "decisions, dates, people, preferences, todos or facts the user told you earlier. Returns the " +
  "best-matching snippets with path, startLine, endLine, score and a citation path#Lstart-Lend; " +
  "call memory_get with a hit's path or citation to read more around it. An empty result means " +
  "nothing relevant is stored. If the result says memory is unavailable, tell the user what it " +
  "says to do instead of guessing.";

export const GET_DESCRIPTION =
  "Read lines of one memory file (a path from a memory_search hit such as MEMORY.md or " +
  'memory/2026-01-02.md, or its citation such as "MEMORY.md#L3-L7"). Use it after ' +
  "memory_search when a snippet is cut short or you need the surrounding lines: pass from " +
  "(1-based first line) and lines (how many). If truncated, call again with from = nextFrom. " +
  "A file that does not exist returns empty text.";

// OpenClaw's own parameter schemas for these tools, so prompts written for it keep working.
export const SEARCH_PARAMETERS = {
  type: "object",
  properties: {
    query: { type: "string" },
    maxResults: { type: "integer", minimum: 1 },
    minScore: { type: "number" },
    corpus: { type: "string", enum: ["memory", "wiki", "all", "sessions"] },
  },
  required: ["query"],
  additionalProperties: false,
};

export const GET_PARAMETERS = {
  type: "object",
  properties: {
    path: { type: "string" },
    from: { type: "integer", minimum: 1 },
    lines: { type: "integer", minimum: 1 },
    corpus: { type: "string", enum: ["memory", "wiki", "all"] },
  },
  required: ["path"],
  additionalProperties: false,
};

/** What to do about an error, for the model (and the person it talks to). */
export function actionFor(/** @type {import("./client.js").MemdError} */ err) {
  switch (err.kind) {
    case "NOT_RUNNING":
      return START_HINT;
    case "UNAVAILABLE":
    case "BUSY":
    case "TIMEOUT":
      return "memd is not answering; retry in a moment, or check `memctl status`.";
    case "UNKNOWN_WORKSPACE":
      return "Register the workspace with `memctl workspace add <dir>`, or fix the plugin's workspace setting.";
    case "PATH_REFUSED":
      return "Use a path from a memory_search hit (MEMORY.md or memory/*.md).";
    case "BAD_REQUEST":
      return "Check the tool's arguments and call it again.";
    case "PROVIDER_UNAVAILABLE":
      return "The embedding provider is unavailable; keyword search still works. Check `memctl status`.";
    case "CONFIG":
      return "Fix the setting the error names (a MEMD_* variable, HOME, or memd's config file).";
    default:
      return "Check `memctl status` and memd's log.";
  }
}

/**
 * An error as a tool result: text the model can act on, and the same as data.
 * @param {unknown} error
 * @param {Record<string, unknown>} [extra]
 * @returns {{ content: { type: "text", text: string }[], details: Record<string, unknown> }}
 */
export function failure(error, extra = {}) {
  const err = asMemdError(error);
  const action = actionFor(err);
  const unavailable = err.unavailable || err.kind === "UNKNOWN_WORKSPACE";
  const details = {
    ...extra,
    error: err.message,
    action,
    ...(unavailable ? { disabled: true, unavailable: true } : {}),
  };
  const text = `${unavailable ? "Memory is unavailable: " : ""}${err.message.replace(/\.$/, "")}. ${action}`;
  return { content: [{ type: "text", text }], details };
}

function result(/** @type {string} */ text, /** @type {unknown} */ details) {
  return { content: [{ type: "text", text }], details };
}

/** OpenClaw's corpus -> memd sources ("wiki" has no counterpart in memd: it is memory). */
export function sourcesOfCorpus(/** @type {string | undefined} */ corpus) {
  if (corpus === "sessions") return ["sessions"];
  if (corpus === "memory" || corpus === "wiki") return ["memory"];
  return undefined;
}

const CITATION = /^(?<path>.+?)#L(?<start>\d+)(?:-L?(?<end>\d+))?$/;

/** "MEMORY.md#L3-L7" -> { path: "MEMORY.md", from: 3, lines: 5 }; a plain path as it is. */
export function splitCitation(/** @type {string} */ path) {
  const m = CITATION.exec(path.trim());
  if (!m?.groups) return { path };
  const start = Number(m.groups.start);
  const end = m.groups.end === undefined ? undefined : Number(m.groups.end);
  if (start < 1 || (end !== undefined && end < start)) return { path };
  return { path: m.groups.path, from: start, lines: end === undefined ? undefined : end - start + 1 };
}

/**
 * The text of a memory_search result.
 * @param {string} query
 * @param {{ results: import("./manager.js").SearchResult[], freshness?: { fresh?: boolean, pending_files?: number },
 *   note?: string }} details
 */
export function searchText(query, details) {
  const hits = details.results;
  const lines = hits.length
    ? [`${hits.length} memory hit(s) for ${JSON.stringify(query)}:`]
    : [`No memory matches ${JSON.stringify(query)}.`];
  hits.forEach((hit, i) => {
    lines.push("", `${i + 1}. ${hit.citation} (score ${hit.score.toFixed(2)})`);
    for (const line of hit.snippet.split("\n")) lines.push(`   ${line}`);
  });
  if (details.freshness?.fresh === false) {
    lines.push("", `(The index is catching up: ${details.freshness.pending_files ?? 0} file(s) pending.)`);
  }
  if (details.note) lines.push("", `Note: ${details.note}`);
  return lines.join("\n");
}

/**
 * The two tools for one session: `resolve()` gives the memd workspace and client of its agent.
 * @param {{ agentId?: string, sessionKey?: string }} ctx
 * @param {(agentId: string) => import("./manager.js").AgentWorkspace} resolve
 */
export function createTools(ctx, resolve) {
  const agentId = ctx.agentId || "main";
  const search = {
    name: "memory_search",
    label: "Memory Search",
    description: SEARCH_DESCRIPTION,
    parameters: SEARCH_PARAMETERS,
    async execute(/** @type {string} */ _id, /** @type {any} */ params, /** @type {AbortSignal} */ signal) {
      const query = String(params?.query ?? "");
      try {
        const reply = await resolve(agentId).call(
          "search",
          {
            query,
            max_results: params?.maxResults,
            min_score: params?.minScore,
            sources: toMemdSources(sourcesOfCorpus(params?.corpus)),
            caller: callerOf(agentId, ctx.sessionKey),
          },
          { signal },
        );
        const details = {
          results: (reply.results ?? []).map(toSearchResult),
          provider: reply.provider,
          model: reply.model,
          mode: reply.mode,
          freshness: reply.freshness,
          ...(reply.note ? { note: reply.note } : {}),
        };
        return result(searchText(query, details), details);
      } catch (err) {
        return failure(err, { results: [] });
      }
    },
  };
  const get = {
    name: "memory_get",
    label: "Memory Get",
    description: GET_DESCRIPTION,
    parameters: GET_PARAMETERS,
    async execute(/** @type {string} */ _id, /** @type {any} */ params, /** @type {AbortSignal} */ signal) {
      const cited = splitCitation(String(params?.path ?? ""));
      try {
        const reply = await resolve(agentId).call(
          "get",
          {
            path: cited.path,
            from: params?.from ?? cited.from,
            lines: params?.lines ?? cited.lines,
            caller: callerOf(agentId, ctx.sessionKey),
          },
          { signal },
        );
        if (reply.missing) {
          const details = { status: "not_found", path: reply.path, text: "" };
          return result(`${reply.path} does not exist (yet): nothing stored there.`, details);
        }
        const details = {
          status: "ok",
          path: reply.path,
          text: reply.text,
          from: reply.from,
          lines: reply.lines,
          ...(reply.truncated ? { truncated: true, nextFrom: reply.next_from } : {}),
        };
        const last = reply.from + Math.max(reply.lines, 1) - 1;
        let text = `${reply.path}#L${reply.from}-L${last}:\n${reply.text}`;
        if (reply.truncated && reply.next_from) {
          text += `\n\n[More content available. Use from=${reply.next_from} to continue.]`;
        }
        return result(text, details);
      } catch (err) {
        return failure(err, { path: cited.path, text: "" });
      }
    },
  };
  return { search, get };
}
