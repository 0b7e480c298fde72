// The KV tier view: what the hot pool (DRAM) and the cold pool (SSD) hold now, and over the
// last minute the rates taken from the server's counters, read once a second — hot hit
// rate, cold bytes read per generated token, score blocks the storage evaluator streamed up per
// second, and tokens per second.

import { useEffect, useState } from "preact/hooks";
import { call, type Tiers } from "./api";

const WINDOW_S = 60;

interface Rates {
  at: number;
  tokensPerSecond: number;
  hitRate: number | null;
  coldBytesPerToken: number | null;
  scoreBlocksPerSecond: number;
}

function rates(a: Tiers, b: Tiers): Rates {
  const seconds = Math.max(0.001, (b.unix_ms - a.unix_ms) / 1000);
  const d = (k: keyof Tiers["totals"]) => b.totals[k] - a.totals[k];
  const hits = d("hot_hits") + d("cold_hits");
  const tokens = d("generated_tokens");
  return {
    at: b.unix_ms,
    tokensPerSecond: tokens / seconds,
    hitRate: hits > 0 ? d("hot_hits") / hits : null,
    coldBytesPerToken: tokens > 0 ? d("cold_bytes_read") / tokens : null,
    scoreBlocksPerSecond: d("score_blocks") / seconds,
  };
}

export function bytes(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} MB`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)} kB`;
  return `${Math.round(n)} B`;
}

export function TiersView() {
  const [readings, setReadings] = useState<Tiers[]>([]);
  const [problem, setProblem] = useState<string | null>(null);

  useEffect(() => {
    const read = async () => {
      try {
        const now = await call<Tiers>("GET", "/v1/hillside/tiers");
        // The readings of the last minute, and the one just before it (the first interval's start).
        setReadings((r) => {
          const kept = [...r, now];
          const start = kept.findIndex((x) => x.unix_ms >= now.unix_ms - WINDOW_S * 1000);
          return kept.slice(Math.max(0, start - 1));
        });
        setProblem(null);
      } catch (e) {
        setProblem((e as Error).message);
      }
    };
    read();
    const timer = setInterval(read, 1000);
    return () => clearInterval(timer);
  }, []);

  const last = readings[readings.length - 1];
  if (!last) return <section class="page">{problem ?? "Reading the tiers…"}</section>;
  const history = readings.slice(1).map((r, i) => rates(readings[i], r));
  // Over the whole minute: the counters' growth from its first reading to its last.
  const minute = readings.length > 1 ? rates(readings[0], last) : null;
  const hit = minute?.hitRate ?? null;
  const coldPerToken = minute?.coldBytesPerToken ?? null;
  const hotShare = last.hot_budget_bytes ? last.hot_bytes / last.hot_budget_bytes : null;
  return (
    <section class="page tiers" aria-label="KV cache tiers">
      <h1>KV cache tiers</h1>
      {problem && (
        <p class="error" role="alert">
          {problem}
        </p>
      )}
      <p class="hint">
        Store <strong>{last.store}</strong> · {last.live_sequences} generating · {last.tokens.toLocaleString()} tokens cached.
        {last.store !== "tiered" && " Only the tiered store has a hot and a cold pool: choose it in Settings (or start with --kv tiered)."}
      </p>
      <div class="cards">
        <Card label="Hot pool (DRAM)" value={hotShare === null ? "—" : `${bytes(last.hot_bytes)} of ${bytes(last.hot_budget_bytes)}`} meter={hotShare} />
        <Card label="Cold pool (SSD)" value={bytes(last.cold_bytes)} />
        <Card label="Memory held by K/V" value={bytes(last.resident_bytes)} />
        <Card label="Hot hit rate, last minute" value={hit === null ? "—" : `${(hit * 100).toFixed(1)} %`} meter={hit} />
        <Card label="Cold bytes read per token, last minute" value={coldPerToken === null ? "—" : bytes(coldPerToken)} />
        <Card label="Score blocks per second" value={history.length ? history[history.length - 1].scoreBlocksPerSecond.toFixed(0) : "—"} />
      </div>
      <h2>Last minute</h2>
      <div class="charts">
        <Chart label="tokens/s" points={history.map((r) => [r.at, r.tokensPerSecond])} now={last.unix_ms} />
        <Chart label="hot hit rate %" points={history.map((r) => [r.at, r.hitRate === null ? null : r.hitRate * 100])} now={last.unix_ms} max={100} />
        <Chart label="cold MB per token" points={history.map((r) => [r.at, r.coldBytesPerToken === null ? null : r.coldBytesPerToken / 1e6])} now={last.unix_ms} />
        <Chart label="score blocks/s" points={history.map((r) => [r.at, r.scoreBlocksPerSecond])} now={last.unix_ms} />
      </div>
    </section>
  );
}

function Card({ label, value, meter }: { label: string; value: string; meter?: number | null }) {
  return (
    <div class="card">
      <div class="card-label">{label}</div>
      <div class="card-value">{value}</div>
      {meter !== undefined && meter !== null && <meter min={0} max={1} value={meter} aria-label={label} />}
    </div>
  );
}

/** A line over the last minute; gaps where there was nothing to measure. */
function Chart({ label, points, now, max }: { label: string; points: [number, number | null][]; now: number; max?: number }) {
  const [w, h] = [300, 80];
  const top = max ?? Math.max(1e-9, ...points.map(([, v]) => v ?? 0));
  const x = (t: number) => w - ((now - t) / (WINDOW_S * 1000)) * w;
  const y = (v: number) => h - (v / top) * (h - 4) - 2;
  const segments: string[] = [];
  let run: string[] = [];
  for (const [t, v] of points) {
    if (v === null) {
      if (run.length) segments.push(run.join(" "));
      run = [];
    } else run.push(`${x(t).toFixed(1)},${y(v).toFixed(1)}`);
  }
  if (run.length) segments.push(run.join(" "));
  const latest = [...points].reverse().find(([, v]) => v !== null)?.[1];
  return (
    <figure class="chart">
      <figcaption>
        {label}
        <span class="chart-value">{latest === undefined || latest === null ? "—" : latest < 10 ? latest.toFixed(2) : latest.toFixed(0)}</span>
      </figcaption>
      <svg viewBox={`0 0 ${w} ${h}`} role="img" aria-label={`${label} over the last minute`} preserveAspectRatio="none">
        <line x1="0" x2={w} y1={h - 2} y2={h - 2} class="axis" />
        {segments.map((s, i) => (
          <polyline key={i} points={s} class="series" />
        ))}
      </svg>
      <div class="chart-scale">
        <span>−60 s</span>
        <span>max {top < 10 ? top.toFixed(2) : top.toFixed(0)}</span>
        <span>now</span>
      </div>
    </figure>
  );
}
