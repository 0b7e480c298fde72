// The window: a sidebar (conversations, with new, search, rename and delete; the views) and
// the open view — a conversation, the models, the documents, the settings, or the KV tiers.

import { useEffect, useState } from "preact/hooks";
import { call, setApiKey, whenKeyNeeded, type ConversationSummary, type ServerConfig } from "./api";
import { Chat } from "./Chat";
import { desktop } from "./desktop";
import { DocumentsView } from "./Documents";
import { ModelsView } from "./Models";
import { SettingsView } from "./Settings";
import { TiersView } from "./Tiers";

// A chat view's `key` stays while its new conversation is saved and gets an id, so the
// conversation's work under way (a reply, a summary) is not thrown away with the component.
type View =
  | { kind: "chat"; id: number | null; key: string }
  | { kind: "models" }
  | { kind: "documents" }
  | { kind: "settings" }
  | { kind: "tiers" };

let newChats = 0;
const newChat = (): View => ({ kind: "chat", id: null, key: `new-${++newChats}` });
const openChat = (id: number): View => ({ kind: "chat", id, key: `conversation-${id}` });

export function App() {
  const [config, setConfig] = useState<ServerConfig | null>(null);
  const [problem, setProblem] = useState<string | null>(null);
  const [view, setView] = useState<View>(newChat);
  const [conversations, setConversations] = useState<ConversationSummary[]>([]);
  const [search, setSearch] = useState("");
  const [askKey, setAskKey] = useState(false);
  const [notice, setNotice] = useState<string | null>(null);

  const loadConfig = () =>
    call<ServerConfig>("GET", "/v1/hillside/config")
      .then((c) => (setConfig(c), setProblem(null)))
      .catch((e) => setProblem(e.message));
  const loadConversations = (q = search) =>
    call<{ data: ConversationSummary[] }>("GET", `/v1/hillside/conversations${q ? `?q=${encodeURIComponent(q)}` : ""}`)
      .then((r) => setConversations(r.data))
      .catch((e) => setProblem(e.message));

  useEffect(() => {
    whenKeyNeeded(() => setAskKey(true));
    desktop?.notice().then(setNotice, () => {});
    loadConfig();
    loadConversations("");
  }, []);
  useEffect(() => {
    const t = setTimeout(() => loadConversations(search), 150);
    return () => clearTimeout(t);
  }, [search]);

  const [renaming, setRenaming] = useState<{ id: number; title: string } | null>(null);
  const rename = async () => {
    if (!renaming) return;
    if (renaming.title.trim()) await call("PATCH", `/v1/hillside/conversations/${renaming.id}`, { title: renaming.title }).catch((e) => setProblem(e.message));
    setRenaming(null);
    loadConversations();
  };
  const remove = async (c: ConversationSummary) => {
    if (!confirm(`Delete "${c.title}"? This cannot be undone.`)) return;
    await call("DELETE", `/v1/hillside/conversations/${c.id}`);
    if (view.kind === "chat" && view.id === c.id) setView(newChat());
    loadConversations();
  };

  return (
    <div class="shell">
      <nav class="sidebar" aria-label="Conversations and views">
        <div class="brand">
          <img src="/favicon.svg" alt="" width={22} height={22} />
          <span>Hillside</span>
        </div>
        <button class="primary" onClick={() => setView(newChat())}>
          New chat
        </button>
        <label class="visually-hidden" for="search">
          Search conversations
        </label>
        <input id="search" type="search" placeholder="Search conversations" value={search} onInput={(e) => setSearch(e.currentTarget.value)} />
        <ul class="conversations">
          {conversations.map((c) => (
            <li key={c.id} class={view.kind === "chat" && view.id === c.id ? "current" : ""}>
              {renaming?.id === c.id ? (
                <input
                  aria-label="New title"
                  autoFocus
                  value={renaming.title}
                  onInput={(e) => setRenaming({ id: c.id, title: e.currentTarget.value })}
                  onKeyDown={(e) => {
                    if (e.key === "Enter") rename();
                    if (e.key === "Escape") setRenaming(null);
                  }}
                  onBlur={rename}
                />
              ) : (
                <button class="conversation" onClick={() => setView(openChat(c.id))} title={c.title}>
                  {c.title}
                </button>
              )}
              <button class="icon" aria-label={`Rename ${c.title}`} title="Rename" onClick={() => setRenaming({ id: c.id, title: c.title })}>
                ✎
              </button>
              <button class="icon" aria-label={`Delete ${c.title}`} title="Delete" onClick={() => remove(c)}>
                ×
              </button>
            </li>
          ))}
          {conversations.length === 0 && <li class="empty">{search ? "Nothing found" : "No conversations yet"}</li>}
        </ul>
        <div class="views">
          <button class={view.kind === "models" ? "current" : ""} onClick={() => setView({ kind: "models" })}>
            Models
          </button>
          <button class={view.kind === "documents" ? "current" : ""} onClick={() => setView({ kind: "documents" })}>
            Documents
          </button>
          <button class={view.kind === "tiers" ? "current" : ""} onClick={() => setView({ kind: "tiers" })}>
            KV tiers
          </button>
          <button class={view.kind === "settings" ? "current" : ""} onClick={() => setView({ kind: "settings" })}>
            Settings
          </button>
        </div>
      </nav>
      <main class="main">
        <header class="topbar">
          {config ? (
            <span class="model" title="The loaded model and each conversation's context">
              <strong>{config.model_id}</strong> · {config.context_tokens.toLocaleString()} tokens of context · KV {config.kv.store}
            </span>
          ) : (
            <span class="model">Connecting…</span>
          )}
        </header>
        {problem && (
          <div class="banner error" role="alert">
            {problem}
          </div>
        )}
        {notice && (
          <div class="banner notice" role="status">
            {notice}
          </div>
        )}
        {view.kind === "chat" && (
          <Chat
            key={view.key}
            id={view.id}
            onSaved={(id) => {
              setView((v) => (v.kind === "chat" && v.id === null ? { ...v, id } : v));
              loadConversations();
            }}
          />
        )}
        {view.kind === "models" && <ModelsView onSwitched={loadConfig} />}
        {view.kind === "documents" && (
          <DocumentsView
            onOpen={(id) => {
              setView(openChat(id));
              loadConversations();
            }}
          />
        )}
        {view.kind === "settings" && <SettingsView />}
        {view.kind === "tiers" && <TiersView />}
      </main>
      {askKey && (
        <KeyDialog
          onDone={(key) => {
            setApiKey(key);
            setAskKey(false);
            loadConfig();
            loadConversations();
          }}
        />
      )}
    </div>
  );
}

function KeyDialog({ onDone }: { onDone: (key: string) => void }) {
  const [key, setKey] = useState("");
  return (
    <div class="dialog-backdrop" role="dialog" aria-modal="true" aria-labelledby="key-title">
      <form
        class="dialog"
        onSubmit={(e) => {
          e.preventDefault();
          if (key.trim()) onDone(key.trim());
        }}
      >
        <h2 id="key-title">This server needs its API key</h2>
        <p>It is in the config file's [server] api_key, or the HILLSIDE_API_KEY it was started with. It is kept in this browser.</p>
        <label for="api-key">API key</label>
        <input id="api-key" type="password" autoFocus value={key} onInput={(e) => setKey(e.currentTarget.value)} />
        <button class="primary" type="submit">
          Use this key
        </button>
      </form>
    </div>
  );
}
