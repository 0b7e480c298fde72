// The server's HTTP API, as the browser and the desktop window both use it: JSON calls, the API
// key (asked for once the server wants one, kept in this browser), and server-sent events read
// from a POST's body.

const KEY_STORAGE = "hillside.apiKey";

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
  localStorage.setItem(KEY_STORAGE, key);
}

function headers(json: boolean): Record<string, string> {
  const h: Record<string, string> = {};
  const key = localStorage.getItem(KEY_STORAGE);
  if (key) h["Authorization"] = `Bearer ${key}`;
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

/** Sends `body` (JSON, or a FormData upload) and returns the JSON answer (`null` for 204). */
export async function call<T>(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
  const form = body instanceof FormData;
  let r: Response;
  try {
    r = await fetch(path, {
      method,
      headers: headers(body !== undefined && !form),
      body: body === undefined ? undefined : form ? body : JSON.stringify(body),
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
  let r: Response;
  try {
    r = await fetch(path, { method: "POST", headers: headers(true), body: JSON.stringify(body), signal });
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
