// The Models and Documents pages in Chromium against `hillside serve` on the real model, with a
// models folder of its own and a model hub on 127.0.0.1 (as `HF_ENDPOINT`, the way a mirror is
// set): installed models apart from available ones, a download whose progress survives a page
// reload, a switch to the downloaded model and a reply from it; then a document added through
// the API found on the Documents page, its unfinished summary resumed, and a question about it.

import { expect, test } from "@playwright/test";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync, mkdirSync, rmSync } from "node:fs";
import { createServer, type Server as HttpServer } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { folders, Server, type Folders } from "./server";

const PRIDE = fileURLToPath(new URL("../../../shared/data/pride-and-prejudice.txt", import.meta.url));
const SCREENSHOTS = fileURLToPath(new URL("../../docs/screenshots/", import.meta.url));
// A catalogue model fetched from the hub; the hub serves the default model's bytes for it.
const PULLED = "smollm2-360m-instruct";

test.describe.configure({ mode: "serial" });

let f: Folders;
let server: Server;
let hub: HttpServer;

/** A hub serving `body` at any path, 1 MiB every 100 ms, with its size and hash on a HEAD's
 * redirect as huggingface.co gives them. */
function startHub(body: Buffer): Promise<HttpServer> {
  const sha256 = createHash("sha256").update(body).digest("hex");
  const hub = createServer((req, res) => {
    if (req.method === "HEAD") {
      res.writeHead(302, { Location: "/cdn/file", "X-Linked-Size": String(body.length), "X-Linked-Etag": `"${sha256}"` }).end();
      return;
    }
    const from = Number(/bytes=(\d+)-/.exec(req.headers.range ?? "")?.[1] ?? 0);
    const headers: Record<string, string> = { "Content-Length": String(body.length - from) };
    if (from > 0) headers["Content-Range"] = `bytes ${from}-${body.length - 1}/${body.length}`;
    res.writeHead(from > 0 ? 206 : 200, headers);
    let at = from;
    const timer = setInterval(() => {
      const next = Math.min(body.length, at + (1 << 20));
      res.write(body.subarray(at, next));
      at = next;
      if (at >= body.length) {
        clearInterval(timer);
        res.end();
      }
    }, 100);
    res.on("close", () => clearInterval(timer));
  });
  return new Promise((resolve) => hub.listen(0, "127.0.0.1", () => resolve(hub)));
}

test.beforeAll(async () => {
  const bin = process.env.HILLSIDE_BIN!;
  const defaultModel = execFileSync(bin, ["models", "path"]).toString().trim();
  hub = await startHub(readFileSync(defaultModel));
  f = folders();
  const models = join(f.root, "models");
  mkdirSync(models);
  server = await Server.start(f, ["--model", defaultModel], {
    HILLSIDE_MODELS_DIR: models,
    HF_ENDPOINT: `http://127.0.0.1:${(hub.address() as AddressInfo).port}`,
    HF_HOME: join(f.root, "no-hf-cache"),
  });
});
test.afterAll(async () => {
  await server?.stop();
  hub?.close();
  if (f) rmSync(f.root, { recursive: true, force: true });
});

test("a model is downloaded with its progress shown through a reload, switched to, and answers", async ({ page }) => {
  // The printed link: its secret lets this tab fetch and switch models, through reloads too.
  await page.goto(server.link);
  await expect(page).toHaveURL(server.url);
  await page.getByRole("button", { name: "Models", exact: true }).click();
  const installed = page.getByRole("list", { name: "Installed models" });
  const available = page.getByRole("list", { name: "Available models" });
  await expect(installed).toContainText("SmolLM2-135M-Instruct.Q4_1 (running)");
  const row = available.getByRole("listitem", { name: PULLED });
  await expect(row.locator(".fit")).toContainText(/fit/);
  await expect(available.getByRole("listitem", { name: "qwen3-30b-a3b" })).toContainText("Apache-2.0");
  await row.getByRole("button", { name: /^Download/ }).click();
  const progress = row.getByLabel(`Downloading ${PULLED}`);
  await expect(progress).toContainText(/of 98\.4 MB/);
  await page.setViewportSize({ width: 1000, height: 1100 });
  await page.locator(".page").evaluate((e) => e.scrollTo(0, 0));
  await page.screenshot({ path: join(SCREENSHOTS, "models.png") });
  await page.setViewportSize({ width: 800, height: 600 });

  // The download runs in the server: a reloaded page finds it still going.
  await page.reload();
  await page.getByRole("button", { name: "Models", exact: true }).click();
  const installedRow = page.getByRole("list", { name: "Installed models" }).getByRole("listitem", { name: PULLED });
  await expect(progress.or(installedRow)).toBeVisible();
  await expect(installedRow).toBeVisible({ timeout: 5 * 60_000 });
  await expect(page.getByRole("list", { name: "Available models" }).getByRole("listitem", { name: PULLED })).toHaveCount(0);

  await installedRow.getByRole("button", { name: "Use" }).click();
  await expect(page.getByRole("status")).toContainText(`Now running ${PULLED}`);
  await expect(page.locator(".topbar")).toContainText(PULLED);
  await page.getByRole("button", { name: "New chat" }).click();
  await page.getByLabel("Message", { exact: true }).fill("Say hello in one word.");
  await page.keyboard.press("Enter");
  await expect(page.locator(".message.assistant").last().locator(".markdown")).not.toBeEmpty();
  expect((await server.api("/health")).model).toBe(PULLED);
});

test("a document added through the API is on the Documents page, and its unfinished summary resumes", async ({ page }) => {
  const pride = readFileSync(PRIDE, "utf8");
  const start = pride.indexOf("It is a truth universally acknowledged");
  // About 2,400 tokens: three chunks at the tests' 2,048-token context.
  const form = new FormData();
  form.append("file", new Blob([pride.slice(start, start + 10_000)], { type: "text/plain" }), "pride.txt");
  const added = await (await fetch(new URL("/v1/hillside/documents", server.url), { method: "POST", body: form })).json();
  // A summary stopped once its first chunk is done, as a closed app leaves it.
  const stop = new AbortController();
  const r = await fetch(new URL(`/v1/hillside/documents/${added.id}/summary`, server.url), {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: "{}",
    signal: stop.signal,
  });
  const reader = r.body!.pipeThrough(new TextDecoderStream()).getReader();
  for (let seen = ""; !seen.includes('"stage":"chunk_summarized"'); ) seen += (await reader.read()).value ?? "";
  stop.abort();

  await page.goto(server.url);
  await page.getByRole("button", { name: "Documents", exact: true }).click();
  const row = page.getByRole("list", { name: "Documents" }).getByRole("listitem", { name: "pride.txt" });
  await expect(row).toContainText(/text · [\d,]+ tokens · 10\.3 kB/);
  await expect(row.locator(".summary-state")).toContainText(/Summary unfinished: [1-3] of 3 chunks done/);
  await page.screenshot({ path: join(SCREENSHOTS, "documents.png") });
  await row.getByRole("button", { name: "Resume summary" }).click();
  const card = page.locator(".message.document");
  await expect(card).toContainText(/of 3 chunks are kept/);
  await card.getByRole("button", { name: "Resume the summary" }).click();
  await expect(card.locator(".points li").first()).toBeVisible({ timeout: 10 * 60_000 });

  // A question about it in the same conversation.
  await page.getByLabel("Message", { exact: true }).fill("Who is the story about?");
  await page.keyboard.press("Enter");
  await expect(page.locator(".message.assistant:not(.document)").last().locator(".markdown")).not.toBeEmpty({ timeout: 5 * 60_000 });
  await page.getByRole("button", { name: "Documents", exact: true }).click();
  await expect(row.locator(".summary-state")).toContainText(/Summarized: \d+ points?/);
});
