// @ts-check
// What memd adds to a session's prompt: the recall instructions, the session-start context
// (MEMORY.md, today's and yesterday's logs under the caller's scope) and the flush plan.
//
// OpenClaw asks for the prompt section and the flush plan synchronously, so both are fetched
// ahead of time (the before_prompt_build hook, once per session and at most once a minute for
// the plan) and read from here.

import { asMemdError, callerOf } from "./manager.js";

const MAX_SESSIONS = 256;
const PLAN_TTL_MS = 60_000;
const CONTEXT_WAIT_MS = 3_000;
const DEFAULT_RESERVE_TOKENS_FLOOR = 20_000;
const MAX_RESERVE_RATIO = 0.25;

export function recallSection(/** @type {Set<string>} */ tools, /** @type {string | undefined} */ citations) {
  if (!tools.has("memory_search") && !tools.has("memory_get")) return [];
  const lines = [
    "## Memory Recall",
    "Before answering anything about prior work, decisions, dates, people, preferences, or todos: " +
      "run memory_search; for memory-file hits, use memory_get to pull only the needed lines. " +
      "If low confidence after search, say you checked.",
    "Report partial, unavailable, or stale recall to the user, including the action the tool result gives.",
  ];
  lines.push(
    citations === "off"
      ? "Citations are disabled: do not mention file paths or line numbers in replies unless the user explicitly asks."
      : "Citations: include Source: <path#line> when it helps the user verify memory snippets.",
  );
  return lines;
}

export class SessionMemory {
  /**
   * @param {{ resolve: (agentId: string) => import("./manager.js").AgentWorkspace,
   *   contextChars: number, log?: { warn?: (msg: string) => void, debug?: (msg: string) => void } }} options
   */
  constructor({ resolve, contextChars, log }) {
    this.resolve = resolve;
    this.contextChars = contextChars;
    this.log = log;
    /** @type {Map<string, { sessionId: string | undefined, text: string }>} by agent and session key */
    this.contexts = new Map();
    /** @type {{ plan: any, at: number } | null} */
    this.plan = null;
  }

  static key(/** @type {string | undefined} */ agentId, /** @type {string | undefined} */ sessionKey) {
    return `${agentId || "main"}\u0000${sessionKey ?? ""}`;
  }

  /** The before_prompt_build hook: fetch what the prompt will need, once per session. */
  async prepare(/** @type {{ agentId?: string, sessionKey?: string, sessionId?: string }} */ ctx) {
    const agentId = ctx.agentId || "main";
    const key = SessionMemory.key(agentId, ctx.sessionKey);
    const work = [];
    const known = this.contexts.get(key);
    if (this.contextChars > 0 && (!known || known.sessionId !== ctx.sessionId)) {
      work.push(this.fetchContext(agentId, ctx, key));
    }
    if (!this.plan || Date.now() - this.plan.at > PLAN_TTL_MS) work.push(this.fetchPlan(agentId));
    await Promise.all(work);
  }

  async fetchContext(/** @type {string} */ agentId, /** @type {{ sessionKey?: string, sessionId?: string }} */ ctx, /** @type {string} */ key) {
    try {
      const reply = await this.resolve(agentId).call(
        "context",
        { max_chars: this.contextChars, caller: callerOf(agentId, ctx.sessionKey) },
        { timeoutMs: CONTEXT_WAIT_MS },
      );
      this.remember(key, { sessionId: ctx.sessionId, text: String(reply.text ?? "") });
    } catch (err) {
      this.log?.warn?.(`memd: no session-start context: ${asMemdError(err).message}`);
    }
  }

  async fetchPlan(/** @type {string} */ agentId) {
    try {
      const plan = await this.resolve(agentId).call("flush_plan", {}, { timeoutMs: CONTEXT_WAIT_MS });
      this.plan = { plan, at: Date.now() };
    } catch (err) {
      this.log?.warn?.(`memd: no flush plan: ${asMemdError(err).message}`);
    }
  }

  remember(/** @type {string} */ key, /** @type {{ sessionId: string | undefined, text: string }} */ value) {
    this.contexts.delete(key);
    this.contexts.set(key, value);
    while (this.contexts.size > MAX_SESSIONS) {
      const oldest = this.contexts.keys().next().value;
      if (oldest === undefined) break;
      this.contexts.delete(oldest);
    }
  }

  /** OpenClaw's promptBuilder: the recall instructions, then this session's memory if fetched. */
  promptSection(/** @type {{ availableTools: Set<string>, citationsMode?: string, agentId?: string, agentSessionKey?: string }} */ params) {
    const lines = recallSection(params.availableTools, params.citationsMode);
    if (!lines.length) return lines;
    const context = this.contexts.get(SessionMemory.key(params.agentId, params.agentSessionKey));
    if (context?.text) {
      lines.push(
        "",
        "## Memory at session start",
        "What memd holds for this session (long-term memory, today's and yesterday's notes), with citations:",
        "",
        context.text,
      );
    }
    lines.push("");
    return lines;
  }

  /**
   * OpenClaw's flushPlanResolver: memd's plan (thresholds, today's log in the user's time zone,
   * the prompts), with the host's own overrides and context-window cap applied as OpenClaw does.
   * Null (no flush) when flushes are turned off or memd has not given a plan.
   */
  flushPlan(/** @type {{ cfg?: any, contextWindowTokens?: number }} */ params = {}) {
    const settings = params.cfg?.agents?.defaults?.compaction?.memoryFlush;
    if (settings?.enabled === false) return null;
    const plan = this.plan?.plan;
    if (!plan) {
      this.log?.warn?.("memd: no flush plan yet (memd unreachable); this compaction flushes nothing");
      return null;
    }
    let softThresholdTokens = nonNegative(settings?.softThresholdTokens) ?? plan.soft_threshold_tokens;
    let reserveTokensFloor = DEFAULT_RESERVE_TOKENS_FLOOR;
    const window = nonNegative(params.contextWindowTokens);
    if (window) {
      reserveTokensFloor = Math.min(reserveTokensFloor, Math.floor(window * MAX_RESERVE_RATIO));
      softThresholdTokens = Math.min(softThresholdTokens, Math.floor((window - reserveTokensFloor) / 2));
    }
    return {
      softThresholdTokens,
      forceFlushTranscriptBytes: nonNegative(settings?.forceFlushTranscriptBytes) ?? plan.force_flush_transcript_bytes,
      reserveTokensFloor,
      ...(settings?.model ? { model: String(settings.model).trim() } : {}),
      prompt: plan.prompt,
      systemPrompt: plan.system_prompt,
      relativePath: plan.relative_path,
    };
  }
}

function nonNegative(/** @type {unknown} */ value) {
  return typeof value === "number" && Number.isInteger(value) && value >= 0 ? value : null;
}
