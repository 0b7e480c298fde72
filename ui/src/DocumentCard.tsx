// A document in a conversation: how it is summarized (whole text or hierarchical) and its
// tokens, the summary's progress, then its points, each with the passages it comes from (a
// click shows the passage and its page or section).

import { useEffect, useRef, useState } from "preact/hooks";
import { call, type Message, type Point, type Source } from "./api";

/** The summary's last progress event (see the server's `hillside.summary.progress`). */
export type SummaryProgress = { name: string } & (
  | { stage: "reading" | "queued" | "done" }
  | { stage: "planned"; tokens: number; mode: string; chunks?: unknown[] }
  | { stage: "prefill"; chunk: number; chunks: number; done_tokens: number; total_tokens: number }
  | { stage: "chunk_summarized"; done: number; chunks: number }
  | { stage: "merging"; level: number; groups: number }
  | { stage: "writing"; text: string }
);

function describe(p: SummaryProgress): { text: string; share?: number } {
  switch (p.stage) {
    case "reading":
      return { text: `Reading ${p.name}…` };
    case "queued":
      return { text: "Waiting for the model…" };
    case "planned":
      return p.mode === "whole"
        ? { text: `Whole text: ${p.tokens.toLocaleString()} tokens in one pass` }
        : { text: `Hierarchical: ${p.tokens.toLocaleString()} tokens in ${p.chunks?.length ?? "?"} chunks` };
    case "prefill": {
      const share = p.done_tokens / Math.max(1, p.total_tokens);
      const chunk = p.chunks > 1 ? ` (chunk ${p.chunk} of ${p.chunks})` : "";
      return { text: `Prefill ${Math.round(share * 100)}%${chunk}`, share };
    }
    case "chunk_summarized":
      return { text: `Chunk ${p.done} of ${p.chunks} summarized`, share: p.done / p.chunks };
    case "merging":
      return { text: `Merging summaries (level ${p.level}, ${p.groups} group${p.groups === 1 ? "" : "s"})` };
    case "writing":
      return { text: "Writing the summary…" };
    case "done":
      return { text: "Done", share: 1 };
  }
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
      {!progress && !meta.points && meta.stopped && <p class="stat">The summary was stopped.</p>}
      {onRetry && !meta.points && (meta.stopped || meta.error) && (
        <button class="link" onClick={onRetry}>
          Summarize again
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
