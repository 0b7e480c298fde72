// The settings page: the config file the CLI reads (model or remote engine, KV store and tiers,
// sampling defaults, port, API key). The server checks each field; its message shows beside the field.
// Changes apply when Hillside next starts.

import { useEffect, useState } from "preact/hooks";
import { ApiError, call, mayChange, type ServerConfig, type Settings } from "./api";

interface Report {
  path: string;
  settings: Settings;
  new_api_key?: string;
}

type Field = keyof Settings;

// The stores a user picks from, and those the benchmarks compare the tiered store with, which
// the page offers only under its advanced fold (or while the file names one).
const EVERYDAY_STORES = ["full", "tiered"];
const COMPARISON_STORES = ["offload", "drop", "near-storage"];

export function SettingsView() {
  const [report, setReport] = useState<Report | null>(null);
  const [form, setForm] = useState<Settings | null>(null);
  const [errors, setErrors] = useState<Partial<Record<Field, string>>>({});
  const [status, setStatus] = useState<string | null>(null);
  const [problem, setProblem] = useState<string | null>(null);
  const [locked, setLocked] = useState(false);
  const [comparing, setComparing] = useState(false);

  useEffect(() => {
    call<Report>("GET", "/v1/hillside/settings")
      .then((r) => (setReport(r), setForm(r.settings)))
      .catch((e) => setProblem(e.message));
    call<ServerConfig>("GET", "/v1/hillside/config")
      .then((c) => setLocked(!mayChange(c)))
      .catch(() => {});
  }, []);
  if (problem) return <section class="page"><p class="error" role="alert">{problem}</p></section>;
  if (!form || !report) return <section class="page">Loading…</section>;

  const set = <K extends Field>(key: K, value: Settings[K]) => {
    setForm({ ...form, [key]: value });
    setErrors(({ [key]: _, ...rest }) => rest);
    setStatus(null);
  };
  const number = (key: Field, raw: string, optional = false) => {
    if (optional && raw.trim() === "") return set(key, null as never);
    const n = Number(raw);
    if (raw.trim() === "" || Number.isNaN(n)) {
      setErrors((e) => ({ ...e, [key]: "enter a number" }));
      return;
    }
    set(key, n as never);
  };
  const save = async (e: Event) => {
    e.preventDefault();
    if (Object.keys(errors).length) return;
    try {
      const r = await call<Report>("PUT", "/v1/hillside/settings", form);
      setReport(r);
      setForm({ ...form, remote_api_key: null });
      setStatus(r.new_api_key ? `Saved. Your new API key (shown once): ${r.new_api_key}` : `Saved to ${r.path}. Restart Hillside to apply.`);
    } catch (err) {
      const e = err as ApiError;
      if (e.param) setErrors({ [e.param]: e.message });
      else if (e.code === "control_secret_needed") setLocked(true);
      else setProblem(e.message);
    }
  };

  const field = (key: Field, label: string, control: preact.ComponentChildren, hint?: string) => (
    <div class={`field${errors[key] ? " invalid" : ""}`}>
      <label for={`setting-${key}`}>{label}</label>
      {control}
      {hint && <small id={`hint-${key}`}>{hint}</small>}
      {errors[key] && (
        <small class="error" id={`error-${key}`} role="alert">
          {errors[key]}
        </small>
      )}
    </div>
  );
  const text = (key: Field, value: string, onInput: (v: string) => void, type: "text" | "number" = "text", step?: string) => {
    // Preact's input types split by `type`; this one control takes both.
    const attributes: Record<string, unknown> = { type, step };
    return (
      <input
        id={`setting-${key}`}
        {...attributes}
        value={value}
        aria-invalid={!!errors[key]}
        aria-describedby={errors[key] ? `error-${key}` : undefined}
        onInput={(e) => onInput(e.currentTarget.value)}
      />
    );
  };
  const choice = (key: Field, value: string, options: string[]) => (
    <select id={`setting-${key}`} value={value} onChange={(e) => set(key, e.currentTarget.value as never)}>
      {options.map((o) => (
        <option key={o} value={o}>
          {o}
        </option>
      ))}
    </select>
  );

  const comparisonShown = comparing || COMPARISON_STORES.includes(form.store);
  const storeChoice = (
    <select id="setting-store" value={form.store} onChange={(e) => set("store", e.currentTarget.value as never)}>
      {EVERYDAY_STORES.map((o) => (
        <option key={o} value={o}>
          {o}
        </option>
      ))}
      {comparisonShown && (
        <optgroup label="For comparison">
          {COMPARISON_STORES.map((o) => (
            <option key={o} value={o}>
              {o}
            </option>
          ))}
        </optgroup>
      )}
    </select>
  );

  return (
    <section class="page settings">
      <h1>Settings</h1>
      <p class="hint">
        Saved to <code>{report.path}</code>, the file <code>hillside</code> reads; they apply when Hillside next starts.
      </p>
      {locked && (
        <p class="error" role="alert" id="settings-locked">
          Changing settings needs this run's secret: open Hillside from the link it printed when it started (<code>web UI at …#secret=…</code>), or from the desktop app.
        </p>
      )}
      <form onSubmit={save} noValidate>
        <fieldset>
          <legend>Model</legend>
          {field("model", "Model", text("model", form.model ?? "", (v) => set("model", v.trim() ? v : null)), "A name from hillside models list, or a .gguf path; empty for the default")}
          {field("engine", "Engine", text("engine", form.engine, (v) => set("engine", v.trim() || "local")), "local, or openai: and the URL of an OpenAI-compatible server (vLLM, llama.cpp, Ollama) that runs the model instead")}
          {field("remote_api_key", "Remote API key", <input id="setting-remote_api_key" type="password" autocomplete="off" value={form.remote_api_key ?? ""} onInput={(e) => set("remote_api_key", e.currentTarget.value || null)} />, "Kept in the config file, never shown; it goes only to the host it was given for: change the host and enter it again")}
          {field("remote_model", "Remote model", text("remote_model", form.remote_model ?? "", (v) => set("remote_model", v.trim() ? v : null)), "Which of the remote's models; empty for the first it lists")}
          <div class="field checkbox">
            <input id="setting-allow_insecure_remote" type="checkbox" checked={form.allow_insecure_remote} onChange={(e) => set("allow_insecure_remote", e.currentTarget.checked)} />
            <label for="setting-allow_insecure_remote">Allow plain HTTP to a remote engine on another machine (documents cross the network unencrypted)</label>
          </div>
        </fieldset>
        <fieldset>
          <legend>KV cache</legend>
          {field("store", "Store", storeChoice, "full: the whole cache in memory; tiered: a hot pool in memory, a cold pool on disk, each step attending to the most important tokens")}
          <details class="advanced" open={comparing || COMPARISON_STORES.includes(form.store)} onToggle={(e) => setComparing(e.currentTarget.open)}>
            <summary>Advanced: stores for comparison</summary>
            <p class="hint">
              What the benchmarks measure the tiered store against, offered above while this is open: offload (everything on disk, all of it read back each step), drop (the least attended tokens discarded for good) and near-storage (exact attention beside the cold pool).
            </p>
          </details>
          {field("alpha", "α (share of tokens attended)", text("alpha", String(form.alpha), (v) => number("alpha", v), "number", "0.01"))}
          {field("hot_budget_mb", "Hot-pool budget (MB)", text("hot_budget_mb", form.hot_budget_mb === null ? "" : String(form.hot_budget_mb), (v) => number("hot_budget_mb", v, true), "number"), "Empty: the planner decides")}
          {field("cold_dir", "Cold-pool directory", text("cold_dir", form.cold_dir, (v) => set("cold_dir", v)), "On the fastest SSD you have")}
          {field("evaluator", "Scoring of cold tokens", choice("evaluator", form.evaluator, ["storage", "host", "xrt"]), "xrt: a SmartSSD's FPGA, where there is one")}
        </fieldset>
        <fieldset>
          <legend>Sampling defaults</legend>
          {field("temperature", "Temperature", text("temperature", String(form.temperature), (v) => number("temperature", v), "number", "0.05"))}
          {field("top_p", "Top p", text("top_p", String(form.top_p), (v) => number("top_p", v), "number", "0.01"))}
          {field("top_k", "Top k", text("top_k", String(form.top_k), (v) => number("top_k", v), "number", "1"))}
          {field("min_p", "Min p", text("min_p", String(form.min_p), (v) => number("min_p", v), "number", "0.01"))}
          {field("repeat_penalty", "Repeat penalty", text("repeat_penalty", String(form.repeat_penalty), (v) => number("repeat_penalty", v), "number", "0.05"))}
        </fieldset>
        <fieldset>
          <legend>Server</legend>
          {field("port", "Port", text("port", String(form.port), (v) => number("port", v), "number", "1"))}
          <div class="field checkbox">
            <input id="setting-require_api_key" type="checkbox" checked={form.require_api_key} onChange={(e) => set("require_api_key", e.currentTarget.checked)} />
            <label for="setting-require_api_key">Require an API key (one is made when you save)</label>
          </div>
        </fieldset>
        <div class="form-actions">
          <button class="primary" type="submit">
            Save
          </button>
          {status && (
            <span class="saved" role="status">
              {status}
            </span>
          )}
        </div>
      </form>
    </section>
  );
}
