// A document in a conversation: how it is summarized (whole text or hierarchical) and its
// tokens, the summary's progress (for a long one: chunks done, tokens read, time taken and
// left; stopped, it can be resumed), then its points, each with the passages it comes from (a
// click shows the passage and its page or section).

import { useEffect, useRef, useState } from "preact/hooks";
import { call, type Message, type Point, type Source } from "./api";

/** How far a long summary has come, from its last `chunk_summarized` or `merged` event. */
export interface SummaryPace {
  chunksDone: number;
  chunks: number;
  tokensRead?: number;
  tokens?: number;
  /** When this run started (performance.now()), and the time it said was left, and when. */
  startedAt: number;
  etaS?: number | null;
  etaAt?: number;
}

/** The summary's last progress event (see the server's `hillside.summary.progress`). */
export type SummaryProgress = { name: string; pace?: SummaryPace } & (
  | { stage: "reading" | "queued" | "done" }
  | { stage: "planned"; tokens: number; mode: string; chunks?: unknown[] }
  | { stage: "resumed"; chunks_done: number; merges_done: number }
  | { stage: "prefill"; chunk: number; chunks: number; done_tokens: number; total_tokens: number }
  | { stage: "chunk_summarized"; done: number; chunks: number; tokens_read: number; elapsed_s: number; eta_s: number | null }
  | { stage: "merging"; level: number; groups: number }
  | { stage: "merged"; level: number; done: number; groups: number; elapsed_s: number; eta_s: number | null }
  | { stage: "writing"; text: string }
);

function describe(p: SummaryProgress): { text: string; share?: number } {
  switch (p.stage) {
    case "reading":
      return { text: `Reading ${p.name}…` };
    case "queued":
      return { text: "Queued: waiting for the summary before it…" };
    case "planned":
      return p.mode === "whole"
        ? { text: `Whole text: ${p.tokens.toLocaleString()} tokens in one pass` }
        : { text: `Hierarchical: ${p.tokens.toLocaleString()} tokens in ${p.chunks?.length ?? "?"} chunks` };
    case "resumed":
      return { text: `Resuming: ${p.chunks_done} chunk${p.chunks_done === 1 ? "" : "s"} kept from before` };
    case "prefill": {
      if (p.chunks > 1 && p.pace) return { text: `Reading chunks (${p.pace.chunksDone} of ${p.pace.chunks} done)`, share: p.pace.chunksDone / p.pace.chunks };
      const share = p.done_tokens / Math.max(1, p.total_tokens);
      const chunk = p.chunks > 1 ? ` (chunk ${p.chunk} of ${p.chunks})` : "";
      return { text: `Prefill ${Math.round(share * 100)}%${chunk}`, share };
    }
    case "chunk_summarized":
      return { text: `Chunk ${p.done} of ${p.chunks} summarized`, share: p.done / p.chunks };
    case "merging":
      return { text: `Merging summaries (level ${p.level}, ${p.groups} group${p.groups === 1 ? "" : "s"})` };
    case "merged":
      return { text: `Merging summaries (level ${p.level}: ${p.done} of ${p.groups})`, share: p.done / p.groups };
    case "writing":
      return { text: "Writing the summary…" };
    case "done":
      return { text: "Done", share: 1 };
  }
}

/** "1:05" from seconds. */
function clock(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  return s >= 3600 ? `${Math.floor(s / 3600)}:${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}:${String(s % 60).padStart(2, "0")}` : `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
}

/** Tokens read, time taken and time left, for a summary that reports its pace. */
function paceLine(pace: SummaryPace, now: number): string {
  const parts = [`${pace.chunksDone} of ${pace.chunks} chunks`];
  if (pace.tokensRead !== undefined && pace.tokens) parts.push(`${pace.tokensRead.toLocaleString()} of ${pace.tokens.toLocaleString()} tokens read`);
  parts.push(`${clock((now - pace.startedAt) / 1000)} elapsed`);
  if (pace.etaS != null && pace.etaAt !== undefined) {
    const left = pace.etaS - (now - pace.etaAt) / 1000;
    parts.push(left > 60 ? `about ${Math.round(left / 60)} min left` : left > 0 ? `about ${Math.round(left)} s left` : "almost done");
  }
  return parts.join(" · ");
}

/** The time now, once a second while `on`. */
function useNow(on: boolean): number {
  const [now, setNow] = useState(performance.now());
  useEffect(() => {
    if (!on) return;
    const timer = setInterval(() => setNow(performance.now()), 1000);
    return () => clearInterval(timer);
  }, [on]);
  return now;
}

function where(source: Source, n: number): string {
  if (source.locator?.page) return `p. ${source.locator.page}`;
  if (source.locator?.heading) return `§ ${source.locator.heading.length > 28 ? source.locator.heading.slice(0, 27) + "…" : source.locator.heading}`;
  return `passage ${n}`;
}

export function DocumentCard({ message, progress, onStop, onRetry }: { message: Message; progress?: SummaryProgress; onStop: () => void; onRetry?: () => void }) {
  const meta = message.meta ?? {};
  const doc = meta.document;
  const [passage, setPassage] = useState<{ title: string; text: string } | null>(null);
  const state = progress ? describe(progress) : null;
  const now = useNow(!!progress?.pace);
  // What a stopped summary kept: said by this session, else by the server (after a restart).
  const kept = meta.kept ?? (doc?.unfinished_summary ? { chunksDone: doc.unfinished_summary.chunks_done, chunks: doc.unfinished_summary.chunks } : undefined);
  const open = async (source: Source, title: string) => {
    try {
      const p = await call<{ text: string }>("GET", `/v1/hillside/documents/${doc!.id}/text?start=${source.bytes.start}&end=${source.bytes.end}`);
      setPassage({ title, text: p.text });
    } catch (e) {
      setPassage({ title, text: (e as Error).message });
    }
  };
  return (
    <article class="message assistant document" aria-busy={!!progress}>
      <header class="document-head">
        <span class="document-name">{doc?.name ?? progress?.name ?? "Document"}</span>
        {doc && (
          <span class="document-plan">
            {doc.mode === "whole" ? "whole text" : "hierarchical"} · {doc.tokens?.toLocaleString() ?? "?"} tokens
          </span>
        )}
      </header>
      {meta.error && (
        <p class="error" role="alert">
          {meta.error}
        </p>
      )}
      {state && (
        <div class="progress" role="status">
          <span>{state.text}</span>
          {state.share !== undefined && <progress max={1} value={state.share} aria-label="Summary progress" />}
          <button class="link" onClick={onStop}>
            Stop
          </button>
        </div>
      )}
      {progress?.pace && <p class="stat pace">{paceLine(progress.pace, now)}</p>}
      {progress?.stage === "writing" && <p class="summary-draft">{progress.text}</p>}
      {meta.points && (
        <ol class="points" aria-label="Summary">
          {meta.points.map((point: Point, i: number) => (
            <li key={i}>
              <span>{point.text}</span>
              {point.sources.length > 0 && (
                <span class="sources">
                  {point.sources.map((s, j) => (
                    <button key={j} class="source" onClick={() => open(s, `${doc?.name}, ${where(s, j + 1)}`)} aria-label={`Source: ${where(s, j + 1)}`}>
                      {where(s, j + 1)}
                    </button>
                  ))}
                </span>
              )}
            </li>
          ))}
        </ol>
      )}
      {!progress && !meta.points && (meta.stopped || kept) && (
        <p class="stat">
          The summary was stopped{kept && kept.chunksDone > 0 ? `; ${kept.chunksDone} of ${kept.chunks} chunks are kept` : ""}.
        </p>
      )}
      {onRetry && !meta.points && (
        <button class="link" onClick={onRetry}>
          {kept && kept.chunksDone > 0 ? "Resume the summary" : meta.stopped || meta.error ? "Summarize again" : "Summarize"}
        </button>
      )}
      {passage && <PassageDialog {...passage} onClose={() => setPassage(null)} />}
    </article>
  );
}

function PassageDialog({ title, text, onClose }: { title: string; text: string; onClose: () => void }) {
  const close = useRef<HTMLButtonElement>(null);
  useEffect(() => {
    close.current?.focus();
    const onKey = (e: KeyboardEvent) => e.key === "Escape" && onClose();
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, []);
  return (
    <div class="dialog-backdrop" onClick={(e) => e.target === e.currentTarget && onClose()}>
      <div class="dialog passage" role="dialog" aria-modal="true" aria-labelledby="passage-title">
        <h2 id="passage-title">{title}</h2>
        <blockquote class="passage-text">{text}</blockquote>
        <button ref={close} onClick={onClose}>
          Close
        </button>
      </div>
    </div>
  );
}
