// The Documents page: the whole library, whichever way a document came in (dropped in the app,
// uploaded through the API, added with the CLI), with its pages, tokens, summary state and kept
// K/V. Opening one starts a conversation that holds it: its summary with the sources, the
// button that resumes an unfinished one, and questions about it.

import { useEffect, useState } from "preact/hooks";
import { call, type Conversation, type DocumentInfo } from "./api";
import { bytes } from "./Tiers";

export function DocumentsView({ onOpen }: { onOpen: (conversation: number) => void }) {
  const [documents, setDocuments] = useState<DocumentInfo[] | null>(null);
  const [problem, setProblem] = useState<string | null>(null);

  const load = () =>
    call<{ data: DocumentInfo[] }>("GET", "/v1/hillside/documents")
      .then((r) => setDocuments(r.data))
      .catch((e) => setProblem(e.message));
  useEffect(() => {
    load();
  }, []);

  /** A new conversation about `doc`, opening with its card (its summary, or the way to one). */
  const open = async (doc: DocumentInfo) => {
    try {
      const points = doc.summary ?? undefined;
      const conversation = await call<Conversation>("POST", "/v1/hillside/conversations", {
        title: doc.name.slice(0, 80),
        documents: [doc.id],
        messages: [
          {
            role: "assistant",
            content: points ? points.map((p) => `- ${p.text}`).join("\n") : "",
            meta: { kind: "document", document: doc, points },
          },
        ],
      });
      onOpen(conversation.id);
    } catch (e) {
      setProblem((e as Error).message);
    }
  };
  const remove = async (doc: DocumentInfo) => {
    if (!confirm(`Delete ${doc.name}, its summary and its kept K/V? Conversations about it stay.`)) return;
    await call("DELETE", `/v1/hillside/documents/${doc.id}`).catch((e) => setProblem(e.message));
    load();
  };

  if (!documents) return <section class="page">{problem ? <p class="error" role="alert">{problem}</p> : "Loading…"}</section>;
  return (
    <section class="page documents" aria-labelledby="documents-title">
      <h1 id="documents-title">Documents</h1>
      {problem && (
        <p class="error" role="alert">
          {problem}
        </p>
      )}
      {documents.length === 0 && <p class="hint">No documents yet: drop one on a conversation, or add one with `hillside docs add`.</p>}
      <ul class="card-list" aria-label="Documents">
        {documents.map((doc) => (
          <li key={doc.id} class="card" aria-label={doc.name}>
            <div class="card-head">
              <strong>{doc.name}</strong>
              <span class="hint">
                {[
                  doc.format,
                  doc.parts > 0 ? `${doc.parts} ${doc.format === "pdf" ? "page" : "section"}${doc.parts === 1 ? "" : "s"}` : null,
                  doc.tokens === null ? null : `${doc.tokens.toLocaleString()} tokens`,
                  bytes(doc.size_bytes),
                  doc.kept_kv_bytes ? `kept K/V ${bytes(doc.kept_kv_bytes)}` : null,
                ]
                  .filter(Boolean)
                  .join(" · ")}
              </span>
            </div>
            <div class="summary-state">{summaryState(doc)}</div>
            <div class="actions">
              <button class="primary" onClick={() => open(doc)}>
                {doc.summary ? "Open summary" : doc.unfinished_summary ? "Resume summary" : "Summarize"}
              </button>
              <button onClick={() => remove(doc)}>Delete</button>
            </div>
          </li>
        ))}
      </ul>
    </section>
  );
}

function summaryState(doc: DocumentInfo): string {
  if (doc.summary) return `Summarized: ${doc.summary.length} point${doc.summary.length === 1 ? "" : "s"}`;
  const u = doc.unfinished_summary;
  if (u) return `Summary unfinished: ${u.chunks_done} of ${u.chunks} chunks done`;
  return "Not summarized yet";
}
