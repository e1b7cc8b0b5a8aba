// @ts-check
// memd's msgpack-RPC protocol over its Unix socket (docs/protocol.md in the memd repository):
// one connection, opened on first use and again after it drops; every call under a deadline.
// When nothing listens, memd is started (`memctl start`, which lets one starter win and makes
// the others wait for it), unless MEMD_AUTOSTART=0 or the plugin's `autostart: false`.

import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import { inspect } from "node:util";
import { decodeMultiStream, encode } from "@msgpack/msgpack";

const REQUEST = 0;
const RESPONSE = 1;
const MAX_REQUEST_BYTES = 1024 * 1024;
const MAX_MSGID = 2 ** 32 - 1;

/** Stable error codes on the wire, as memd_client.errors.Code. */
export const Code = Object.freeze({
  INTERNAL: 1,
  BAD_REQUEST: 2,
  UNKNOWN_METHOD: 3,
  UNKNOWN_WORKSPACE: 4,
  PATH_REFUSED: 5,
  PROVIDER_UNAVAILABLE: 6,
  BUSY: 7,
  TIMEOUT: 8,
  TOO_LARGE: 9,
  UNAUTHORIZED: 10,
  INDEX: 11,
  CONFIG: 12,
});

const CODE_NAMES = Object.fromEntries(Object.entries(Code).map(([k, v]) => [v, k]));

export const START_HINT =
  "Start memd with `memd run` (or install it as a service: `memctl service install`).";

/** How long `memctl start` may take: a first start imports numpy and opens every index. */
const START_TIMEOUT_MS = 120_000;
const OFF = new Set(["0", "false", "no", "off"]);
// What Python's str.strip() strips (String.prototype.trim differs: it strips U+FEFF, keeps
// U+001C-U+001F and U+0085), so that a value means here what it means to memd_client.
const SPACE = "[\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";
const SURROUNDING_SPACE = new RegExp(`^${SPACE}+|${SPACE}+$`, "g");

/** Whether clients start memd when it is not running (MEMD_AUTOSTART, default on). */
export function autostartEnabled(env = process.env) {
  return !OFF.has(String(env.MEMD_AUTOSTART ?? "").replace(SURROUNDING_SPACE, "").toLowerCase());
}

/** An error memd returned, or one about reaching it; `code` is a wire code or a local kind. */
export class MemdError extends Error {
  /**
   * @param {number | "NOT_RUNNING" | "UNAVAILABLE"} code
   * @param {string} message
   */
  constructor(code, message) {
    super(message);
    this.name = "MemdError";
    this.code = code;
    this.kind = typeof code === "number" ? (CODE_NAMES[code] ?? `CODE_${code}`) : code;
  }

  /** True when memory as a whole cannot be reached (not a mistake in one request). */
  get unavailable() {
    return this.kind === "NOT_RUNNING" || this.kind === "UNAVAILABLE";
  }
}

/**
 * The daemon's socket, resolved as memd resolves it (memd_client.paths.socket_path, to the
 * byte): MEMD_SOCKET, else MEMD_HOME/run, else XDG_RUNTIME_DIR/memd, else the state
 * directory's run/ (macOS: Application Support, unless XDG_CONFIG_HOME is set). A home
 * directory that cannot be found (of a `~user`, or with no HOME) is a MemdError (CONFIG).
 * @param {NodeJS.ProcessEnv} [env]
 * @param {NodeJS.Platform} [platform]
 */
export function defaultSocketPath(env = process.env, platform = process.platform) {
  if (env.MEMD_SOCKET) return expandPath(env.MEMD_SOCKET, env, "MEMD_SOCKET");
  if (env.MEMD_HOME) return posixPath(expandPath(env.MEMD_HOME, env, "MEMD_HOME"), "run", "memd.sock");
  const home = posixPath(env.HOME || expandUser("~", env));
  if (!env.HOME && home.startsWith("~")) {
    throw new MemdError(Code.CONFIG, "HOME is not set, and the password database has no home directory for this user");
  }
  if (env.XDG_RUNTIME_DIR) return posixPath(env.XDG_RUNTIME_DIR, "memd", "memd.sock");
  const state =
    platform === "darwin" && env.XDG_CONFIG_HOME === undefined
      ? posixPath(home, "Library", "Application Support", "memd")
      : posixPath(env.XDG_STATE_HOME || posixPath(home, ".local", "state"), "memd");
  return posixPath(state, "run", "memd.sock");
}

/**
 * Segments joined and written as Python's pathlib writes a path: empty and "." segments
 * dropped, ".." kept (it is not resolved: a symlink may stand before it), an absolute segment
 * starting over, and two leading slashes (no more) kept as they are.
 * @param {string[]} segments
 */
export function posixPath(...segments) {
  let root = "";
  /** @type {string[]} */
  let parts = [];
  for (const segment of segments) {
    const rest = segment.replace(/^\/+/, "");
    const slashes = segment.length - rest.length;
    if (slashes > 0) {
      root = slashes === 2 ? "//" : "/";
      parts = [];
    }
    for (const part of rest.split("/")) if (part && part !== ".") parts.push(part);
  }
  return root + parts.join("/") || ".";
}

/**
 * `p` with a leading `~` or `~user` replaced by that home directory, as pathlib's
 * Path(p).expanduser(); `name` is the setting it came from, for the error.
 * @param {string} p @param {NodeJS.ProcessEnv} env @param {string} name
 */
function expandPath(p, env, name) {
  const normal = posixPath(p);
  if (!normal.startsWith("~")) return normal;
  const [first, ...rest] = normal.split("/");
  const home = expandUser(first, env);
  if (home.startsWith("~")) throw noHome(name, p);
  return posixPath(home, ...rest);
}

/** @param {string} name @param {string} value */
function noHome(name, value) {
  return new MemdError(Code.CONFIG, `${name} is ${JSON.stringify(value)}: its home directory cannot be found`);
}

/**
 * os.path.expanduser: `~` is HOME (even empty), else the user's home in the password database;
 * `~user` is that user's; one that cannot be found leaves `p` as it is.
 * @param {string} p @param {NodeJS.ProcessEnv} env
 */
function expandUser(p, env) {
  if (!p.startsWith("~")) return p;
  const end = p.indexOf("/", 1) < 0 ? p.length : p.indexOf("/", 1);
  const home = end === 1 ? (env.HOME ?? ownHome()) : homeOf(p.slice(1, end));
  if (home === undefined) return p;
  return home.replace(/\/+$/, "") + p.slice(end) || "/";
}

/** This user's home directory in the password database (HOME aside). */
function ownHome() {
  try {
    return os.userInfo().homedir;
  } catch {
    return undefined; // no entry for this uid
  }
}

/**
 * A user's home directory: this user's, else the one /etc/passwd gives (users that only a
 * directory service knows are not found: their `~user` stays unexpanded).
 * @param {string} user
 */
function homeOf(user) {
  try {
    const me = os.userInfo();
    if (me.username === user) return me.homedir;
  } catch {
    // no entry for this uid: look in the file
  }
  try {
    for (const line of fs.readFileSync("/etc/passwd", "utf8").split("\n")) {
      const fields = line.split(":");
      if (fields.length >= 7 && fields[0] === user) return fields[5];
    }
  } catch {
    // no /etc/passwd
  }
  return undefined;
}

/**
 * memd's error on the wire (`[code, message]`) as a MemdError, read as memd_client's from_wire
 * reads it: a code that is not an integer, or an error of another shape, is INTERNAL.
 * @param {unknown} error
 */
export function errorFromWire(error) {
  if (Array.isArray(error) && error.length === 2) {
    const [code, message] = error;
    return new MemdError(Number.isInteger(code) ? code : Code.INTERNAL, String(message));
  }
  return new MemdError(Code.INTERNAL, `malformed error from memd: ${inspect(error, { breakLength: Infinity })}`);
}

/** Leave out null and undefined values: memd wants optional arguments absent, not nil. */
function compact(/** @type {Record<string, unknown>} */ params) {
  return Object.fromEntries(Object.entries(params).filter(([, v]) => v !== undefined && v !== null));
}

/** @typedef {{ timeoutMs?: number, signal?: AbortSignal }} CallOptions a call's deadline and its abort */

export class MemdClient {
  /**
   * @param {{ socketPath?: string, timeoutMs?: number, autostart?: boolean, memctl?: string }} [options]
   *   autostart: start memd when nothing listens (default: MEMD_AUTOSTART, on);
   *   memctl: the memctl that starts it (default: `memctl` on PATH).
   */
  constructor(options = {}) {
    /** @type {MemdError | null} why memd's socket cannot be known: every call fails with it */
    this.pathError = null;
    let socketPath = options.socketPath;
    if (!socketPath) {
      try {
        socketPath = defaultSocketPath();
      } catch (err) {
        if (!(err instanceof MemdError)) throw err;
        this.pathError = err;
      }
    }
    this.socketPath = socketPath ?? "";
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.autostart = options.autostart ?? autostartEnabled();
    this.memctl = options.memctl || "memctl";
    /** @type {Promise<void> | null} */
    this.starting = null;
    /** @type {net.Socket | null} */
    this.socket = null;
    /** @type {Promise<net.Socket> | null} */
    this.connecting = null;
    /** @type {Map<number, { resolve: (v: any) => void, reject: (e: Error) => void }>} */
    this.pending = new Map();
    this.msgid = 0;
    this.closed = false;
  }

  /**
   * Call `method` with named `params`; resolves to its result map or rejects with MemdError.
   * @param {string} method
   * @param {Record<string, unknown>} [params]
   * @param {CallOptions} [options]
   * @returns {Promise<any>}
   */
  async call(method, params = {}, options = {}) {
    if (this.closed) throw new MemdError("UNAVAILABLE", "the memd client was closed");
    options.signal?.throwIfAborted();
    this.msgid = this.msgid >= MAX_MSGID ? 1 : this.msgid + 1;
    const msgid = this.msgid;
    const body = compact(params);
    const frame = encode([REQUEST, msgid, method, Object.keys(body).length ? [body] : []]);
    if (frame.byteLength > MAX_REQUEST_BYTES) {
      throw new MemdError(Code.TOO_LARGE, `${method}: the request is over 1 MiB`);
    }
    const socket = await this.connect();
    const timeoutMs = options.timeoutMs ?? this.timeoutMs;
    return await new Promise((resolve, reject) => {
      /** @type {NodeJS.Timeout | undefined} */
      let timer;
      const onAbort = () => {
        finish();
        reject(options.signal?.reason ?? new Error("aborted"));
        // The reply may still come: this connection can no longer be trusted to pair them.
        this.drop(socket, new MemdError("UNAVAILABLE", `${method} was aborted`));
      };
      const finish = () => {
        clearTimeout(timer);
        options.signal?.removeEventListener("abort", onAbort);
        this.pending.delete(msgid);
        // An idle connection does not keep the process alive (a CLI command exits when done).
        if (this.pending.size === 0) socket.unref();
      };
      this.pending.set(msgid, {
        resolve: (v) => {
          finish();
          resolve(v);
        },
        reject: (e) => {
          finish();
          reject(e);
        },
      });
      if (timeoutMs > 0) {
        timer = setTimeout(() => {
          finish();
          reject(new MemdError(Code.TIMEOUT, `memd did not answer ${method} within ${timeoutMs} ms`));
          // A late reply must not be taken for the next request's: close this connection.
          this.drop(socket, new MemdError("UNAVAILABLE", `an earlier call timed out`));
        }, timeoutMs);
      }
      options.signal?.addEventListener("abort", onAbort, { once: true });
      socket.ref();
      socket.write(frame);
    });
  }

  /** @returns {Promise<net.Socket>} */
  connect() {
    if (this.pathError) return Promise.reject(this.pathError);
    if (this.socket && !this.socket.destroyed) return Promise.resolve(this.socket);
    if (this.connecting) return this.connecting;
    this.connecting = this.open().catch(async (err) => {
      if (!(err instanceof MemdError && err.kind === "NOT_RUNNING" && this.autostart)) throw err;
      // Calls that arrive while memd starts wait for the same start.
      this.starting ??= this.start().finally(() => (this.starting = null));
      await this.starting;
      return await this.open();
    });
    this.connecting.finally(() => (this.connecting = null)).catch(() => {});
    return this.connecting;
  }

  /** Start memd with `memctl start` (one starter wins; the others wait for it to answer). */
  start() {
    return new Promise((resolve, reject) => {
      const env = { ...process.env, MEMD_STARTED_BY: process.env.MEMD_STARTED_BY || `openclaw (pid ${process.pid})` };
      const child = spawn(this.memctl, ["--socket", this.socketPath, "start", "--json"], {
        env,
        stdio: ["ignore", "pipe", "pipe"],
        timeout: START_TIMEOUT_MS,
      });
      let out = "";
      let err = "";
      child.stdout.on("data", (d) => (out += d));
      child.stderr.on("data", (d) => (err += d));
      child.on("error", (/** @type {NodeJS.ErrnoException} */ e) => {
        const why =
          e.code === "ENOENT"
            ? `${this.memctl} was not found to start it (set the memd plugin's \`memctl\` to its path)`
            : `${this.memctl} failed: ${e.message}`;
        reject(new MemdError("NOT_RUNNING", `memd is not running (nothing listens on ${this.socketPath}), and ${why}. ${START_HINT}`));
      });
      child.on("close", (code) => {
        if (code === 0) return resolve(undefined);
        let message = err.trim().split("\n").pop() || `memctl start exited with status ${code}`;
        try {
          message = JSON.parse(out).error?.message ?? message;
        } catch {
          // not JSON: the last line of its error output says it
        }
        reject(new MemdError("NOT_RUNNING", message));
      });
    });
  }

  /** Connect once, without starting anything. @returns {Promise<net.Socket>} */
  open() {
    return new Promise((resolve, reject) => {
      const socket = net.createConnection({ path: this.socketPath });
      const onError = (/** @type {NodeJS.ErrnoException} */ err) => {
        reject(connectError(err, this.socketPath, this.autostart));
      };
      socket.once("error", onError);
      socket.once("connect", () => {
        socket.off("error", onError);
        this.socket = socket;
        socket.on("error", (err) =>
          this.drop(socket, new MemdError("UNAVAILABLE", `connection to memd failed: ${err.message}`)),
        );
        socket.on("close", () =>
          this.drop(socket, new MemdError("UNAVAILABLE", "memd closed the connection")),
        );
        this.readLoop(socket);
        resolve(socket);
      });
    });
  }

  /** @param {net.Socket} socket */
  async readLoop(socket) {
    try {
      for await (const message of decodeMultiStream(socket)) {
        if (!Array.isArray(message) || message[0] !== RESPONSE) continue; // notifications
        const [, msgid, error, result] = message;
        const waiter = this.pending.get(msgid);
        if (!waiter) continue; // a reply to a call that timed out
        if (error === null || error === undefined) waiter.resolve(result);
        else waiter.reject(errorFromWire(error));
      }
    } catch (err) {
      this.drop(socket, new MemdError("UNAVAILABLE", `memd sent what is not msgpack: ${err}`));
    }
  }

  /** Forget `socket` and fail what waits on it (the next call opens a new connection). */
  drop(/** @type {net.Socket} */ socket, /** @type {Error} */ error) {
    if (this.socket === socket) this.socket = null;
    socket.destroy();
    for (const waiter of [...this.pending.values()]) waiter.reject(error);
  }

  close() {
    this.closed = true;
    if (this.socket) this.drop(this.socket, new MemdError("UNAVAILABLE", "the memd client was closed"));
  }
}

/** @param {NodeJS.ErrnoException} err @param {string} socketPath @param {boolean} autostart */
function connectError(err, socketPath, autostart) {
  if (err.code === "ENOENT" || err.code === "ECONNREFUSED") {
    const off = autostart ? "" : " (MEMD_AUTOSTART is off: the plugin does not start it)";
    return new MemdError("NOT_RUNNING", `memd is not running (nothing listens on ${socketPath}). ${START_HINT}${off}`);
  }
  return new MemdError("UNAVAILABLE", `cannot connect to memd at ${socketPath}: ${err.message}`);
}
