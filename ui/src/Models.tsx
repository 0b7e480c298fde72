// The Models page: the installed models apart from those a download would fetch (so that no
// click on a listed model starts a large download by surprise), each with whether it fits this
// machine at the context the user picks; downloads with their progress (they run in the server,
// so a reloaded page finds them still going), cancel, delete, import a dropped .gguf, and
// switching the loaded model without a restart.

import { useEffect, useState } from "preact/hooks";
import { ApiError, call, follow, type Download, type ModelsReport, type ShelfModel } from "./api";
import { desktop } from "./desktop";
import { bytes } from "./Tiers";

const CONTEXTS = [2048, 4096, 8192, 16384, 32768, 65536, 131072];

export function ModelsView({ onSwitched }: { onSwitched: () => void }) {
  const [report, setReport] = useState<ModelsReport | null>(null);
  const [context, setContext] = useState<number | null>(null);
  const [downloads, setDownloads] = useState<Download[]>([]);
  const [problem, setProblem] = useState<string | null>(null);
  const [status, setStatus] = useState<string | null>(null);
  const [switching, setSwitching] = useState<string | null>(null);
  const [dragging, setDragging] = useState(false);

  const load = (c = context) =>
    call<ModelsReport>("GET", `/v1/hillside/models${c ? `?context=${c}` : ""}`)
      .then((r) => {
        setReport(r);
        setDownloads(r.downloads);
        setContext(r.context_tokens);
        setSwitching(r.switch.loading);
      })
      .catch((e) => setProblem(e.message));

  const act = async (what: () => Promise<unknown>, done?: string) => {
    setProblem(null);
    setStatus(null);
    try {
      await what();
      if (done) setStatus(done);
    } catch (e) {
      setProblem((e as ApiError).message);
    }
    load();
  };

  useEffect(() => {
    load();
    // Downloads as they go; one that ends changes what is installed.
    const stop = new AbortController();
    let running = new Set<string>();
    follow(
      "/v1/hillside/downloads",
      (list: Download[]) => {
        setDownloads(list);
        const now = new Set(list.filter((d) => d.state === "running").map((d) => d.name));
        if ([...running].some((name) => !now.has(name))) load();
        running = now;
      },
      stop.signal,
    ).catch(() => {});
    // In the desktop app a .gguf dropped on the window arrives as a path the user chose.
    const unlisten = desktop?.onFilesDropped((paths) => {
      for (const path of paths.filter((p) => p.toLowerCase().endsWith(".gguf"))) {
        act(() => call("POST", "/v1/hillside/models/import", { path }), `Imported ${path.split("/").pop()}.`);
      }
    });
    return () => (stop.abort(), unlisten?.());
  }, []);

  if (!report) return <section class="page">{problem ? <p class="error" role="alert">{problem}</p> : "Loading…"}</section>;

  const pull = (m: ShelfModel) => act(() => call("POST", "/v1/hillside/models/pull", { model: m.name }));
  const cancel = (name: string) => act(() => call("DELETE", `/v1/hillside/downloads/${encodeURIComponent(name)}`));
  const remove = (m: ShelfModel) => {
    if (!confirm(`Delete ${m.name} (${bytes(m.size_bytes)}) from ${m.path}?`)) return;
    act(() => call("DELETE", `/v1/hillside/models/${encodeURIComponent(m.name)}`), `Deleted ${m.name}.`);
  };
  const use = async (m: ShelfModel) => {
    setSwitching(m.name);
    await act(async () => {
      const r = await call<{ loaded: string; load_s: number }>("POST", `/v1/hillside/models/${encodeURIComponent(m.name)}/load`);
      onSwitched();
      setStatus(`Now running ${r.loaded} (loaded in ${r.load_s.toFixed(1)} s). Replies under way finished on the model before.`);
    });
    setSwitching(null);
  };
  const importFiles = async (files: FileList | null) => {
    for (const file of Array.from(files ?? [])) {
      await act(() => call("POST", `/v1/hillside/models/import?name=${encodeURIComponent(file.name)}`, file), `Imported ${file.name}.`);
    }
  };

  const installed = report.models.filter((m) => m.installed);
  const available = report.models.filter((m) => !m.installed);
  const downloadOf = (name: string) => downloads.find((d) => d.name === name && d.state === "running");
  const others = downloads.filter((d) => !report.models.some((m) => m.name === d.name));

  return (
    <section
      class={`page models${dragging ? " dragging" : ""}`}
      aria-labelledby="models-title"
      onDragOver={(e) => (e.preventDefault(), setDragging(true))}
      onDragLeave={() => setDragging(false)}
      onDrop={(e) => {
        e.preventDefault();
        setDragging(false);
        importFiles(e.dataTransfer?.files ?? null);
      }}
    >
      <h1 id="models-title">Models</h1>
      <div class="models-toolbar">
        <label for="fit-context">Will it fit, at</label>
        <select
          id="fit-context"
          value={String(context)}
          onChange={(e) => {
            const c = Number(e.currentTarget.value);
            setContext(c);
            load(c);
          }}
        >
          {[...new Set([...CONTEXTS, report.context_tokens])].sort((a, b) => a - b).map((c) => (
            <option value={String(c)}>{c.toLocaleString()} tokens of context</option>
          ))}
        </select>
        {report.manageable && (
          <label class="button">
            Import a .gguf…
            <input type="file" accept=".gguf" class="visually-hidden" onChange={(e) => importFiles(e.currentTarget.files)} />
          </label>
        )}
      </div>
      {problem && (
        <p class="error" role="alert">
          {problem}
        </p>
      )}
      {report.switch.last_error && !problem && (
        <p class="error" role="alert">
          The last switch failed, and {report.loaded} kept running: {report.switch.last_error}
        </p>
      )}
      {status && <p role="status">{status}</p>}

      <h2>Installed</h2>
      <ul class="card-list" aria-label="Installed models">
        {installed.map((m) => (
          <ModelRow key={m.name} model={m} loaded={m.name === report.loaded}>
            {m.name === report.loaded ? (
              <span class="badge">Running</span>
            ) : (
              report.manageable && (
                <>
                  <button class="primary" disabled={switching !== null} onClick={() => use(m)}>
                    {switching === m.name ? "Loading…" : "Use"}
                  </button>
                  <button onClick={() => remove(m)} disabled={switching !== null}>
                    Delete
                  </button>
                </>
              )
            )}
          </ModelRow>
        ))}
        {installed.every((m) => m.name !== report.loaded) && <li class="card">{report.loaded} (running)</li>}
      </ul>

      {report.manageable && (
        <>
          <h2>Available to download</h2>
          <ul class="card-list" aria-label="Available models">
            {available.map((m) => {
              const d = downloadOf(m.name);
              return (
                <ModelRow key={m.name} model={m} loaded={false}>
                  {d ? <Progress download={d} onCancel={() => cancel(d.name)} /> : <button onClick={() => pull(m)}>Download {bytes(m.size_bytes)}</button>}
                  <LastAttempt download={downloads.find((x) => x.name === m.name && x.state !== "running")} />
                </ModelRow>
              );
            })}
          </ul>
          {others.length > 0 && (
            <ul class="card-list" aria-label="Other downloads">
              {others.map((d) => (
                <li class="card" key={d.name}>
                  <strong>{d.name}</strong>
                  {d.state === "running" ? <Progress download={d} onCancel={() => cancel(d.name)} /> : <LastAttempt download={d} />}
                </li>
              ))}
            </ul>
          )}
        </>
      )}
    </section>
  );
}

function ModelRow({ model: m, loaded, children }: { model: ShelfModel; loaded: boolean; children: preact.ComponentChildren }) {
  const facts = [m.family, m.format, bytes(m.size_bytes), m.context_tokens ? `${m.context_tokens.toLocaleString()} tokens` : null, m.licence]
    .filter(Boolean)
    .join(" · ");
  return (
    <li class={`card${loaded ? " loaded" : ""}`} aria-label={m.name}>
      <div class="card-head">
        <strong>{m.name}</strong>
        {m.default && <span class="badge">default</span>}
        <span class="hint">{facts}</span>
      </div>
      {m.description && <div class="hint">{m.description}</div>}
      {m.fit && (
        <div class={`fit ${m.fit.verdict}`} title={`weights ${bytes(m.fit.weights_bytes)}, K/V ${bytes(m.fit.kv_bytes)}, free ${bytes(m.fit.memory_free_bytes)}`}>
          {m.fit.sentence}
        </div>
      )}
      <div class="actions">{children}</div>
    </li>
  );
}

function Progress({ download: d, onCancel }: { download: Download; onCancel: () => void }) {
  const share = d.total_bytes ? d.done_bytes / d.total_bytes : undefined;
  const left = d.seconds_left === null ? "" : `, ${Math.ceil(d.seconds_left)} s left`;
  return (
    <div class="progress" aria-label={`Downloading ${d.name}`}>
      <progress value={share} max={1} />
      <span class="stat">
        {bytes(d.done_bytes)}
        {d.total_bytes ? ` of ${bytes(d.total_bytes)}` : ""} · {bytes(d.bytes_per_s)}/s{left}
      </span>
      <button class="stop" onClick={onCancel}>
        Cancel
      </button>
    </div>
  );
}

function LastAttempt({ download: d }: { download?: Download }) {
  if (!d || d.state === "done") return null;
  return (
    <small class={d.state === "failed" ? "error" : "hint"} role={d.state === "failed" ? "alert" : undefined}>
      {d.error}
    </small>
  );
}
