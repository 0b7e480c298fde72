// One conversation: streamed replies (stop, regenerate, edit and resend, copy), documents
// dropped on the window or picked (their summary's progress, points and sources), and
// follow-up questions about them that reuse their kept K/V. Saved to the server after each turn.

import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, call, stream, type Conversation, type DocumentInfo, type Message, type MessageMeta } from "./api";
import { DocumentCard, type SummaryPace, type SummaryProgress } from "./DocumentCard";
import { desktop } from "./desktop";
import { renderMarkdown } from "./markdown";

export function Chat({ id, onSaved }: { id: number | null; onSaved: (id: number) => void }) {
  const [messages, setMessages] = useState<Message[]>([]);
  const [draft, setDraft] = useState("");
  const [running, setRunning] = useState<AbortController | null>(null);
  const [progress, setProgress] = useState<Record<number, SummaryProgress>>({});
  const [editing, setEditing] = useState<{ index: number; text: string } | null>(null);
  const [dragging, setDragging] = useState(false);
  const [problem, setProblem] = useState<string | null>(null);
  // The latest values for async work, which outlives the render that started it.
  const current = useRef<{ id: number | null; messages: Message[]; documents: string[] }>({ id, messages: [], documents: [] });
  const saving = useRef<Promise<void>>(Promise.resolve());
  const summaries = useRef<Map<number, AbortController>>(new Map());
  // Summaries run one after another, each card waiting its turn.
  const summaryQueue = useRef<Promise<void>>(Promise.resolve());
  const list = useRef<HTMLDivElement>(null);
  const input = useRef<HTMLTextAreaElement>(null);

  useEffect(() => {
    // A conversation this component just saved is already shown.
    if (id === null || (id === current.current.id && current.current.messages.length > 0)) return;
    call<Conversation>("GET", `/v1/hillside/conversations/${id}`)
      .then((c) => {
        current.current = { id: c.id, messages: c.messages, documents: c.documents };
        setMessages(c.messages);
        // A summary stopped by closing the app: the server says what of it is kept.
        c.messages.forEach((m, index) => {
          const doc = m.meta?.kind === "document" && !m.meta.points ? m.meta.document : undefined;
          if (doc) call<DocumentInfo>("GET", `/v1/hillside/documents/${doc.id}`).then((fresh) => current.current.id === c.id && withMeta(index, { document: fresh }), () => {});
        });
      })
      .catch((e) => setProblem(e.message));
  }, [id]);
  useEffect(() => input.current?.focus(), []);
  useEffect(() => {
    const el = list.current;
    if (el && el.scrollHeight - el.scrollTop - el.clientHeight < 160) el.scrollTop = el.scrollHeight;
  }, [messages, progress]);
  // Esc stops the reply being written (read through a ref: a key pressed right after the reply
  // starts must not meet a listener from the render before).
  const writing = useRef<AbortController | null>(null);
  writing.current = running;
  useEffect(() => {
    const onKey = (e: KeyboardEvent) => {
      if (e.key === "Escape") writing.current?.abort();
    };
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, []);
  // The desktop app hands over dropped files as paths.
  useEffect(() => desktop?.onFilesDropped((paths) => addDocuments(paths.map((path) => ({ path })))), []);
  useEffect(() => () => summaries.current.forEach((c) => c.abort()), []);

  const show = (next: Message[]) => {
    current.current.messages = next;
    setMessages(next);
  };
  const change = (index: number, f: (m: Message) => Message) => {
    const next = current.current.messages.slice();
    next[index] = f(next[index]);
    show(next);
  };
  const withMeta = (index: number, meta: MessageMeta) => change(index, (m) => ({ ...m, meta: { ...m.meta, ...meta } }));

  /** Saves the conversation (creating it on its first turn); one save at a time, in order. */
  const save = (title: string) => {
    saving.current = saving.current.then(async () => {
      const { id, messages, documents } = current.current;
      try {
        const saved =
          id === null
            ? await call<Conversation>("POST", "/v1/hillside/conversations", { title: title.slice(0, 80), messages, documents })
            : await call<Conversation>("PATCH", `/v1/hillside/conversations/${id}`, { messages, documents });
        current.current.id = saved.id;
        onSaved(saved.id);
      } catch (e) {
        setProblem(`The conversation could not be saved: ${(e as Error).message}`);
      }
    });
    return saving.current;
  };

  /** Writes the assistant's reply to `history` (which ends with the user's turn). */
  const generate = async (history: Message[]) => {
    const ask = history.filter((m) => !m.meta?.kind && !m.meta?.error && (m.role !== "assistant" || m.content));
    const index = history.length;
    show([...history, { role: "assistant", content: "", meta: {} }]);
    const controller = new AbortController();
    writing.current = controller;
    setRunning(controller);
    setProblem(null);
    const documents = current.current.documents;
    let first = 0;
    let usage: any = null;
    let read: any = null;
    let meta: MessageMeta = {};
    try {
      const body = {
        messages: ask.map(({ role, content }) => ({ role, content })),
        stream: true,
        stream_options: { include_usage: true },
        // No max_tokens: a reply may take the rest of the context (a document's question leaves
        // little of it), and Stop or Esc ends it sooner.
        ...(documents.length ? { hillside: { documents } } : {}),
      };
      await stream(
        "/v1/chat/completions",
        body,
        (event) => {
          const thought = event.choices?.[0]?.delta?.reasoning_content;
          if (thought) {
            first ||= performance.now();
            change(index, (m) => ({ ...m, meta: { ...m.meta, reasoning: (m.meta?.reasoning ?? "") + thought } }));
          }
          const delta = event.choices?.[0]?.delta?.content;
          if (delta) {
            first ||= performance.now();
            change(index, (m) => ({ ...m, content: m.content + delta }));
          }
          if (event.usage) usage = event.usage;
          if (event.hillside) read = event.hillside;
        },
        controller.signal,
      );
      const seconds = (performance.now() - first) / 1000;
      const cached = usage?.prompt_tokens_details?.cached_tokens ?? 0;
      meta = {
        completionTokens: usage?.completion_tokens,
        tokensPerSecond: usage && first && usage.completion_tokens > 1 && seconds > 0 ? (usage.completion_tokens - 1) / seconds : undefined,
        promptTokens: usage?.prompt_tokens,
        cachedTokens: cached,
        ...(read ? { documentTokens: read.document_tokens, documentTokensPrefilled: Math.max(0, read.document_tokens - cached) } : {}),
      };
    } catch (e) {
      meta = (e as Error).name === "AbortError" ? { stopped: true } : { error: (e as Error).message };
    } finally {
      withMeta(index, meta);
      setRunning(null);
      await save(history.find((m) => m.role === "user")?.content ?? "New chat");
      input.current?.focus();
    }
  };

  const send = () => {
    const text = draft.trim();
    if (!text || running) return;
    setDraft("");
    generate([...current.current.messages, { role: "user", content: text }]);
  };
  const regenerate = () => {
    const all = current.current.messages;
    const lastUser = all.map((m) => m.role).lastIndexOf("user");
    if (lastUser >= 0 && !running) generate(all.slice(0, lastUser + 1));
  };
  const resend = () => {
    if (!editing || !editing.text.trim() || running) return;
    const history = [...current.current.messages.slice(0, editing.index), { role: "user" as const, content: editing.text.trim() }];
    setEditing(null);
    generate(history);
  };

  /** Adds documents (uploads, or paths the desktop app was given), then summarizes each. */
  const addDocuments = async (sources: ({ file: File } | { path: string })[]) => {
    for (const source of sources) {
      const name = "file" in source ? source.file.name : source.path.split("/").pop()!;
      const index = current.current.messages.length;
      show([...current.current.messages, { role: "assistant", content: "", meta: { kind: "document" } }]);
      setProgress((p) => ({ ...p, [index]: { stage: "reading", name } }));
      let info: DocumentInfo;
      try {
        if ("file" in source) {
          const form = new FormData();
          form.append("file", source.file, source.file.name);
          info = await call<DocumentInfo>("POST", "/v1/hillside/documents", form);
        } else {
          info = await call<DocumentInfo>("POST", "/v1/hillside/documents", { path: source.path });
        }
      } catch (e) {
        withMeta(index, { error: `${name}: ${(e as ApiError).message}` });
        setProgress(({ [index]: _, ...rest }) => rest);
        await save(name);
        continue;
      }
      withMeta(index, { document: info });
      if (!current.current.documents.includes(info.id)) current.current.documents = [...current.current.documents, info.id];
      await save(info.name);
      enqueueSummary(index, info);
    }
  };

  /** Queues the summary of the document shown at `index` (a stopped one resumes where it stopped). */
  const enqueueSummary = (index: number, info: DocumentInfo) => {
    const controller = new AbortController();
    summaries.current.set(index, controller);
    withMeta(index, { stopped: undefined, error: undefined, kept: undefined });
    setProgress((p) => ({ ...p, [index]: { stage: "queued", name: info.name } }));
    summaryQueue.current = summaryQueue.current.then(() => summarize(index, info, controller));
  };

  const summarize = async (index: number, info: DocumentInfo, controller: AbortController) => {
    let pace: SummaryPace | undefined;
    try {
      if (controller.signal.aborted) throw new DOMException("stopped while queued", "AbortError");
      await stream(
        `/v1/hillside/documents/${info.id}/summary`,
        {},
        (event) => {
          if (event.object === "hillside.summary.progress") {
            const now = performance.now();
            if (event.stage === "planned" && event.mode === "hierarchical") pace = { chunksDone: 0, chunks: event.chunks.length, tokens: event.tokens, startedAt: now };
            if (pace && event.stage === "resumed") pace = { ...pace, chunksDone: event.chunks_done };
            if (pace && event.stage === "chunk_summarized") pace = { ...pace, chunksDone: event.done, tokensRead: event.tokens_read, etaS: event.eta_s, etaAt: now };
            if (pace && event.stage === "merged") pace = { ...pace, etaS: event.eta_s, etaAt: now };
            // The summary's text arrives piece by piece: it is kept whole until the points come.
            setProgress((p) => {
              const before = p[index];
              const text = event.stage === "writing" ? (before?.stage === "writing" ? before.text : "") + event.text : undefined;
              return { ...p, [index]: text === undefined ? { ...event, name: info.name, pace } : { stage: "writing", name: info.name, text, pace } };
            });
          }
          if (event.object === "hillside.summary") {
            const points = event.points as { text: string }[];
            change(index, (m) => ({ ...m, content: points.map((p) => `- ${p.text}`).join("\n"), meta: { ...m.meta, points: event.points } }));
          }
        },
        controller.signal,
      );
    } catch (e) {
      const kept = pace && pace.chunksDone > 0 ? { chunksDone: pace.chunksDone, chunks: pace.chunks } : undefined;
      withMeta(index, (e as Error).name === "AbortError" ? { stopped: true, kept } : { error: (e as Error).message, kept });
    } finally {
      summaries.current.delete(index);
      setProgress(({ [index]: _, ...rest }) => rest);
      await save(info.name);
    }
  };

  const onDrop = (e: DragEvent) => {
    e.preventDefault();
    setDragging(false);
    const files = Array.from(e.dataTransfer?.files ?? []);
    if (files.length) addDocuments(files.map((file) => ({ file })));
  };
  const lastAssistant = messages.map((m) => m.role === "assistant" && !m.meta?.kind).lastIndexOf(true);

  return (
    <section
      class={`chat${dragging ? " dragging" : ""}`}
      aria-label="Conversation"
      onDragOver={(e) => {
        e.preventDefault();
        setDragging(true);
      }}
      onDragLeave={(e) => {
        if (e.currentTarget === e.target) setDragging(false);
      }}
      onDrop={onDrop}
    >
      {problem && (
        <div class="banner error" role="alert">
          {problem}
        </div>
      )}
      <div class="messages" ref={list} role="log" aria-live="polite" aria-label="Messages">
        {messages.length === 0 && (
          <div class="welcome">
            <h1>Ask anything, or drop a document here</h1>
            <p>PDF, DOCX, EPUB, HTML, Markdown or text: you get its summary with the passages each point comes from, then ask about it.</p>
          </div>
        )}
        {messages.map((m, i) =>
          m.meta?.kind === "document" ? (
            <DocumentCard
              key={i}
              message={m}
              progress={progress[i]}
              onStop={() => summaries.current.get(i)?.abort()}
              onRetry={m.meta.document && !progress[i] ? () => enqueueSummary(i, m.meta!.document!) : undefined}
            />
          ) : editing?.index === i ? (
            <div key={i} class="message user editing">
              <label class="visually-hidden" for="edit-message">
                Edit your message
              </label>
              <textarea
                id="edit-message"
                value={editing.text}
                autoFocus
                onInput={(e) => setEditing({ index: i, text: e.currentTarget.value })}
                onKeyDown={(e) => {
                  if (e.key === "Enter" && !e.shiftKey) {
                    e.preventDefault();
                    resend();
                  }
                  if (e.key === "Escape") setEditing(null);
                }}
              />
              <div class="actions">
                <button class="primary" onClick={resend}>
                  Send
                </button>
                <button onClick={() => setEditing(null)}>Cancel</button>
              </div>
            </div>
          ) : (
            <MessageView
              key={i}
              message={m}
              writing={running !== null && i === messages.length - 1 && m.role === "assistant"}
              onEdit={m.role === "user" && !running ? () => setEditing({ index: i, text: m.content }) : undefined}
              onRegenerate={i === lastAssistant && !running ? regenerate : undefined}
            />
          ),
        )}
      </div>
      <form
        class="composer"
        onSubmit={(e) => {
          e.preventDefault();
          send();
        }}
      >
        <label class="visually-hidden" for="prompt">
          Message
        </label>
        <textarea
          id="prompt"
          ref={input}
          rows={2}
          placeholder="Message Hillside (Enter sends, Shift+Enter for a new line)"
          value={draft}
          onInput={(e) => setDraft(e.currentTarget.value)}
          onKeyDown={(e) => {
            if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
              e.preventDefault();
              send();
            }
          }}
        />
        <div class="composer-actions">
          <label class="button">
            Add document
            <input
              type="file"
              class="visually-hidden"
              multiple
              onChange={(e) => {
                const files = Array.from(e.currentTarget.files ?? []);
                e.currentTarget.value = "";
                addDocuments(files.map((file) => ({ file })));
              }}
            />
          </label>
          {running ? (
            <button type="button" class="stop" onClick={() => running.abort()} title="Stop (Esc)">
              Stop
            </button>
          ) : (
            <button type="submit" class="primary" disabled={!draft.trim()}>
              Send
            </button>
          )}
        </div>
      </form>
    </section>
  );
}

function MessageView({ message, writing, onEdit, onRegenerate }: { message: Message; writing: boolean; onEdit?: () => void; onRegenerate?: () => void }) {
  const meta = message.meta ?? {};
  const [copied, setCopied] = useState(false);
  const copy = async () => {
    await navigator.clipboard?.writeText(message.content).catch(() => {});
    setCopied(true);
    setTimeout(() => setCopied(false), 1500);
  };
  return (
    <article class={`message ${message.role}`} aria-busy={writing}>
      {meta.reasoning && (
        <details class="reasoning">
          <summary>{writing && !message.content ? "Reasoning…" : "Reasoning"}</summary>
          <div class="plain">{meta.reasoning}</div>
        </details>
      )}
      {message.role === "assistant" ? (
        <div class="markdown" dangerouslySetInnerHTML={{ __html: renderMarkdown(message.content || (writing && !meta.reasoning ? "…" : "")) }} />
      ) : (
        <div class="plain">{message.content}</div>
      )}
      {meta.error && (
        <p class="error" role="alert">
          {meta.error}
        </p>
      )}
      {!writing && (
        <footer class="message-footer">
          {meta.stopped && <span class="stat">stopped</span>}
          {meta.tokensPerSecond !== undefined && <span class="stat tokens-per-second">{meta.tokensPerSecond.toFixed(1)} tokens/s</span>}
          {meta.promptTokens !== undefined && (
            <span class="stat reuse" title="Prompt tokens whose K/V was reused instead of read again">
              {meta.cachedTokens?.toLocaleString()} of {meta.promptTokens.toLocaleString()} prompt tokens reused
            </span>
          )}
          {meta.documentTokens !== undefined && (
            <span class="stat document-reuse" title="The document's K/V, kept since its summary, was reused">
              {meta.documentTokensPrefilled?.toLocaleString()} document tokens prefilled
            </span>
          )}
          <span class="message-actions">
            {message.content && (
              <button class="link" onClick={copy} aria-label="Copy the message">
                {copied ? "Copied" : "Copy"}
              </button>
            )}
            {onEdit && (
              <button class="link" onClick={onEdit}>
                Edit
              </button>
            )}
            {onRegenerate && (
              <button class="link" onClick={onRegenerate}>
                Regenerate
              </button>
            )}
          </span>
        </footer>
      )}
    </article>
  );
}
