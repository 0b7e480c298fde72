// The server's HTTP API, as the browser and the desktop window both use it: JSON calls, the API
// key (asked for once the server wants one) and this run's control secret (from the link Hillside
// printed, or the desktop window's), both kept only while this tab is open, and server-sent events
// read from a POST's body.

const KEY_STORAGE = "hillside.apiKey";
const SECRET_STORAGE = "hillside.controlSecret";

// The secret arrives in the link's fragment, which browsers never send: keep it for this tab and
// take it out of the address bar (and so out of bookmarks and history). A link pasted into a tab
// already open changes only the fragment: the page then starts again with the secret.
function takeSecret(): boolean {
  const fromLink = /(?:^#|&)secret=([0-9a-f]+)/.exec(location.hash);
  if (fromLink) {
    sessionStorage.setItem(SECRET_STORAGE, fromLink[1]);
    history.replaceState(null, "", location.pathname + location.search);
  }
  return !!fromLink;
}
takeSecret();
window.addEventListener("hashchange", () => {
  if (takeSecret()) location.reload();
});
// Earlier versions kept the key in localStorage, which outlives the tab.
localStorage.removeItem(KEY_STORAGE);

/** Whether this tab may change settings and models: it holds this run's secret, or the API key. */
export function mayChange(config: { api_key_required: boolean }): boolean {
  return config.api_key_required ? !!sessionStorage.getItem(KEY_STORAGE) : !!sessionStorage.getItem(SECRET_STORAGE);
}

/** An error the server explained: `message` is for people, `param` names a field, `code` a kind. */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message);
  }
}

let onKeyNeeded: () => void = () => {};

/** Called when a request is refused for a missing or wrong API key. */
export function whenKeyNeeded(f: () => void) {
  onKeyNeeded = f;
}

export function setApiKey(key: string) {
  sessionStorage.setItem(KEY_STORAGE, key);
}

function headers(json: boolean): Record<string, string> {
  const h: Record<string, string> = {};
  const key = sessionStorage.getItem(KEY_STORAGE);
  if (key) h["Authorization"] = `Bearer ${key}`;
  const secret = sessionStorage.getItem(SECRET_STORAGE);
  if (secret) h["X-Hillside-Control"] = secret;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

async function failure(r: Response): Promise<ApiError> {
  if (r.status === 401) onKeyNeeded();
  try {
    const body = await r.json();
    const e = body.error ?? {};
    return new ApiError(e.message ?? `${r.status} ${r.statusText}`, r.status, e.param ?? null, e.code ?? null);
  } catch {
    return new ApiError(`${r.status} ${r.statusText}`, r.status);
  }
}

/** Sends `body` (JSON, a FormData upload, or a file's bytes) and returns the JSON answer
 * (`null` for 204). */
export async function call<T>(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
  const raw = body instanceof FormData || body instanceof Blob;
  const h = headers(body !== undefined && !raw);
  if (body instanceof Blob) h["Content-Type"] = "application/octet-stream";
  let r: Response;
  try {
    r = await fetch(path, {
      method,
      headers: h,
      body: body === undefined ? undefined : raw ? (body as BodyInit) : JSON.stringify(body),
      signal,
    });
  } catch (e) {
    if ((e as Error).name === "AbortError") throw e;
    throw new ApiError("The Hillside server cannot be reached. Is it still running?", 0);
  }
  if (!r.ok) throw await failure(r);
  return r.status === 204 ? (null as T) : ((await r.json()) as T);
}

/** POSTs `body` and hands each server-sent event's JSON to `onEvent`, until `[DONE]`. */
export async function stream(path: string, body: unknown, onEvent: (data: any) => void, signal?: AbortSignal): Promise<void> {
  return events(path, { method: "POST", headers: headers(true), body: JSON.stringify(body) }, onEvent, signal);
}

/** GETs a stream of server-sent events (one that goes on until `signal` stops it). */
export async function follow(path: string, onEvent: (data: any) => void, signal?: AbortSignal): Promise<void> {
  return events(path, { method: "GET", headers: { ...headers(false), Accept: "text/event-stream" } }, onEvent, signal);
}

async function events(path: string, init: RequestInit, onEvent: (data: any) => void, signal?: AbortSignal): Promise<void> {
  let r: Response;
  try {
    r = await fetch(path, { ...init, signal });
  } catch (e) {
    if ((e as Error).name === "AbortError") throw e;
    throw new ApiError("The Hillside server cannot be reached. Is it still running?", 0);
  }
  if (!r.ok || !r.body) throw await failure(r);
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  // Stopping ends the read at once, whatever the body's stream does with the abort.
  signal?.addEventListener("abort", () => reader.cancel().catch(() => {}));
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (signal?.aborted) throw new DOMException("the reply was stopped", "AbortError");
    if (done) return;
    buffered += value;
    let end: number;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      const data = event
        .split("\n")
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const parsed = JSON.parse(data);
      // An error after the stream began arrives as an event of its own.
      if (parsed.error) throw new ApiError(parsed.error.message, 500, parsed.error.param ?? null, parsed.error.code ?? null);
      onEvent(parsed);
    }
  }
}

// ---- The wire types this UI reads (see /openapi.json) ----

export type Role = "system" | "user" | "assistant";

/** What the UI shows beside a message; the server keeps it as given. */
export interface MessageMeta {
  kind?: "document" | "summary";
  /** The model's reasoning before its answer (`reasoning_content`), shown folded. */
  reasoning?: string;
  tokensPerSecond?: number;
  promptTokens?: number;
  cachedTokens?: number;
  completionTokens?: number;
  /** Document questions: the document part's tokens, and those read again. */
  documentTokens?: number;
  documentTokensPrefilled?: number;
  document?: DocumentInfo;
  points?: Point[];
  error?: string;
  stopped?: boolean;
  /** A stopped summary's chunks kept by the server: asking again resumes from them. */
  kept?: { chunksDone: number; chunks: number };
}

export interface Message {
  role: Role;
  content: string;
  meta?: MessageMeta;
}

export interface Conversation {
  id: number;
  title: string;
  created_s: number;
  updated_s: number;
  documents: string[];
  messages: Message[];
}

export interface ConversationSummary {
  id: number;
  title: string;
  updated_s: number;
  messages: number;
}

/** A PDF page (from 1), or a section by its heading. */
export interface Locator {
  page?: number;
  heading?: string;
}

export interface Source {
  bytes: { start: number; end: number };
  locator: Locator | null;
}

export interface Point {
  text: string;
  sources: Source[];
}

export interface DocumentInfo {
  id: string;
  name: string;
  format: string;
  size_bytes: number;
  tokens: number | null;
  mode: "whole" | "hierarchical";
  parts: number;
  /** A summary stopped before it finished, resumed when asked again. */
  unfinished_summary?: { chunks_done: number; chunks: number } | null;
  /** The last summary's points (absent until summarized). */
  summary?: Point[] | null;
  created?: number;
  used?: number;
  kept_kv_bytes?: number;
}

export interface ServerConfig {
  model_id: string;
  context_tokens: number;
  api_key_required: boolean;
  kv: { store: string };
}

export interface Settings {
  model: string | null;
  store: string;
  alpha: number;
  hot_budget_mb: number | null;
  cold_dir: string;
  evaluator: string;
  temperature: number;
  top_p: number;
  top_k: number;
  min_p: number;
  repeat_penalty: number;
  port: number;
  require_api_key: boolean;
  engine: string;
  remote_model: string | null;
  allow_insecure_remote: boolean;
  /** Sent only to change it; never shown. */
  remote_api_key?: string | null;
}

export interface FitReport {
  verdict: "fits" | "fits_tiered" | "does_not_fit";
  sentence: string;
  context_tokens: number;
  weights_bytes: number;
  kv_bytes: number;
  memory_free_bytes: number;
  hot_bytes: number | null;
  cold_bytes: number | null;
}

export interface ShelfModel {
  name: string;
  description: string | null;
  family: string | null;
  format: string | null;
  size_bytes: number;
  context_tokens: number | null;
  licence: string | null;
  source: string;
  path: string | null;
  installed: boolean;
  default: boolean;
  fit: FitReport | null;
}

export interface Download {
  name: string;
  state: "running" | "done" | "failed" | "cancelled";
  done_bytes: number;
  total_bytes: number | null;
  bytes_per_s: number;
  seconds_left: number | null;
  error: string | null;
  started_s: number;
}

export interface ModelsReport {
  loaded: string;
  context_tokens: number;
  models: ShelfModel[];
  downloads: Download[];
  switch: { loading: string | null; last_error: string | null };
  manageable: boolean;
}

export interface Tiers {
  unix_ms: number;
  store: string;
  live_sequences: number;
  tokens: number;
  resident_bytes: number;
  hot_bytes: number;
  hot_budget_bytes: number;
  cold_bytes: number;
  totals: { generated_tokens: number; cold_bytes_read: number; hot_hits: number; cold_hits: number; score_blocks: number };
}
