// The web UI in Chromium against `hillside serve` on the real model: a streamed reply, stopping
// one, a document's summary with progress and sources, a follow-up that reuses the document's
// K/V, the history after a restart, documents dropped together summarized in turn with a long
// one's pace shown, stopped and resumed, a bad file's error, the settings page's checks, and a
// page on another origin that tries to write to the app; and a thinking model's reasoning, shown
// folded apart from its answer.

import { expect, test, type Page } from "@playwright/test";
import { execFileSync } from "node:child_process";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { folders, Server, type Folders } from "./server";

const GPL = fileURLToPath(new URL("../../../shared/data/gpl-3.0.txt", import.meta.url));
const PRIDE = fileURLToPath(new URL("../../../shared/data/pride-and-prejudice.txt", import.meta.url));
const TINY_GGUF = fileURLToPath(new URL("../../tests/tools/tiny-gguf.sh", import.meta.url));
// The default model, which `make test` fetched: its vocabulary goes into the tiny model.
const MODELS = process.env.HILLSIDE_MODELS_DIR ?? join(process.env.XDG_DATA_HOME ?? join(homedir(), ".local/share"), "hillside/models");

test.describe.configure({ mode: "serial" });

// Made in `beforeAll`, not when the file loads: Playwright loads it more than once.
let f: Folders;
let server: Server;

test.beforeAll(async () => {
  f = folders();
  server = await Server.start(f);
});
test.afterAll(async () => {
  await server?.stop();
  // The server's data folder holds the conversations' saved K/V (~170 MB).
  if (f) rmSync(f.root, { recursive: true, force: true });
});

async function send(page: Page, text: string) {
  await page.getByLabel("Message", { exact: true }).fill(text);
  await page.keyboard.press("Enter");
}

test("a message gets a streamed reply, with its speed and reuse", async ({ page }) => {
  await page.goto(server.url);
  await expect(page.locator(".topbar")).toContainText("smollm2-135m-instruct");
  await expect(page.locator(".topbar")).toContainText("2,048 tokens of context");
  await send(page, "What is the capital of France? Answer in one sentence.");
  await expect(page.locator(".message.user .plain")).toHaveText("What is the capital of France? Answer in one sentence.");
  const reply = page.locator(".message.assistant").last();
  await expect(reply.locator(".tokens-per-second")).toContainText("tokens/s");
  await expect(reply.locator(".markdown")).not.toBeEmpty();
  await expect(reply.locator(".reuse")).toContainText("prompt tokens reused");
  // Saved as a conversation, named after the first message.
  await expect(page.locator(".conversations li")).toHaveCount(1);
  await expect(page.locator(".conversations li").first()).toContainText("What is the capital of France?");
});

test("Esc stops a reply mid-way and frees its sequence", async ({ page }) => {
  await page.goto(server.url);
  await send(page, "Write a very long story about a dragon who learns to bake bread. Make it at least two thousand words.");
  const reply = page.locator(".message.assistant").last();
  await expect(reply.locator(".markdown")).not.toHaveText(/^…?$/);
  await expect(page.getByRole("button", { name: "Stop", exact: true })).toBeVisible();
  await page.keyboard.press("Escape");
  await expect(reply.locator(".stat", { hasText: "stopped" })).toBeVisible();
  await expect(page.getByRole("button", { name: "Send" })).toBeVisible();
  // The server gave the sequence up: nothing is generating.
  await expect.poll(async () => (await server.api("/v1/hillside/tiers")).live_sequences).toBe(0);
  const text = await reply.locator(".markdown").innerText();
  expect(text.split(/\s+/).length).toBeLessThan(1500);
});

test("a dropped document is summarized with progress and sources, and a follow-up reuses its K/V", async ({ page }) => {
  await page.goto(server.url);
  await page.getByRole("button", { name: "New chat" }).click();
  // A drop from the desktop gives the same files as the picker; the browser's picker is the input.
  // The license's first sections (about 1,300 tokens), which fit the tests' context whole.
  const gpl = readFileSync(GPL, "utf8");
  const opening = join(f.root, "gpl-3.0.txt");
  writeFileSync(opening, gpl.slice(0, gpl.lastIndexOf("\n\n", 6000)));
  await page.locator("input[type=file]").setInputFiles(opening);
  const card = page.locator(".message.document").last();
  await expect(card.locator(".document-plan")).toContainText(/whole text · 1,\d{3} tokens/);
  await expect(card.locator(".progress")).toContainText(/Prefill \d+%|Queued|Whole text/);
  await expect(card.locator("progress")).toBeVisible();
  // The summary's text streams in, then becomes its points.
  await expect(card.locator(".summary-draft")).toContainText(/\w+/);
  await expect(card.locator(".points li").first()).toBeVisible({ timeout: 10 * 60_000 });
  await expect(card.locator(".progress")).toHaveCount(0);
  // A point's source opens its passage, which is the license's own text.
  await card.locator("button.source").first().click();
  const dialog = page.getByRole("dialog");
  await expect(dialog).toContainText("gpl-3.0.txt");
  const passage = await dialog.locator(".passage-text").innerText();
  expect(gpl).toContain(passage.trim().slice(0, 80));
  await page.keyboard.press("Escape");
  await expect(dialog).toHaveCount(0);

  await send(page, "Can I sell copies of a program under this license?");
  const answer = page.locator(".message.assistant").last();
  await expect(answer.locator(".document-reuse")).toHaveText("0 document tokens prefilled");
  await expect(answer.locator(".markdown")).not.toBeEmpty();
});

test("the conversations are still there after a restart", async ({ page }) => {
  await server.stop();
  server = await Server.start(f);
  await page.goto(server.url);
  const items = page.locator(".conversations li");
  await expect(items).toHaveCount(3);
  await page.getByRole("button", { name: "gpl-3.0.txt", exact: true }).click();
  await expect(page.locator(".message.document .points li").first()).toBeVisible();
  await expect(page.locator(".message.assistant .document-reuse")).toHaveText("0 document tokens prefilled");
  // Search finds a conversation by the words of its messages.
  await page.getByLabel("Search conversations").fill("dragon");
  await expect(items).toHaveCount(1);
  await expect(items.first()).toContainText("Write a very long story");
});

test("documents dropped together are summarized in turn, and a long one is stopped and resumed", async ({ page }) => {
  await page.goto(server.url);
  await page.getByRole("button", { name: "New chat" }).click();
  const pride = readFileSync(PRIDE, "utf8");
  const start = pride.indexOf("It is a truth universally acknowledged");
  // About 2,400 tokens: three chunks at the tests' 2,048-token context.
  const long = { name: "pride.txt", mimeType: "text/plain", buffer: Buffer.from(pride.slice(start, start + 10_000)) };
  const short = { name: "note.txt", mimeType: "text/plain", buffer: Buffer.from(pride.slice(start, start + 1_500)) };
  await page.locator("input[type=file]").setInputFiles([long, short]);
  const cards = page.locator(".message.document");
  await expect(cards).toHaveCount(2);
  const [first, second] = [cards.nth(0), cards.nth(1)];
  await expect(first.locator(".document-plan")).toContainText("hierarchical");
  await expect(second.locator(".progress")).toContainText("Queued");
  // The long summary's pace, then Stop: what it did is kept, and the next document's turn comes.
  await expect(first.locator(".pace")).toContainText(/\d of 3 chunks · [\d,]+ of [\d,]+ tokens read · \d+:\d\d elapsed · (about|almost)/, { timeout: 10 * 60_000 });
  await first.getByRole("button", { name: "Stop" }).click();
  await expect(first.locator(".stat").first()).toContainText(/The summary was stopped; \d of 3 chunks are kept/);
  await expect(second.locator(".points li").first()).toBeVisible({ timeout: 10 * 60_000 });
  await first.getByRole("button", { name: "Resume the summary" }).click();
  // It goes on from what it kept.
  await expect(first.locator(".pace")).toContainText(/[1-3] of 3 chunks/);
  await expect(first.locator(".points li").first()).toBeVisible({ timeout: 10 * 60_000 });
  await expect(first.locator(".progress")).toHaveCount(0);
});

/** A PDF of `pages` empty pages: what a scan without a text layer looks like to a reader. */
function scannedPdf(pages: number): Buffer {
  const kids = Array.from({ length: pages }, (_, i) => `${i + 3} 0 R`).join(" ");
  const objects = [
    "<< /Type /Catalog /Pages 2 0 R >>",
    `<< /Type /Pages /Kids [${kids}] /Count ${pages} >>`,
    ...Array.from({ length: pages }, () => "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>"),
  ];
  let pdf = "%PDF-1.4\n";
  const offsets = objects.map((body, i) => {
    const at = pdf.length;
    pdf += `${i + 1} 0 obj\n${body}\nendobj\n`;
    return at;
  });
  const xref = pdf.length;
  pdf += `xref\n0 ${objects.length + 1}\n0000000000 65535 f \n${offsets.map((o) => `${String(o).padStart(10, "0")} 00000 n \n`).join("")}`;
  pdf += `trailer\n<< /Size ${objects.length + 1} /Root 1 0 R >>\nstartxref\n${xref}\n%%EOF\n`;
  return Buffer.from(pdf, "latin1");
}

test("a bad file shows its error, not a spinner", async ({ page }) => {
  await page.goto(server.url);
  const lastError = () => page.locator(".message.document").last().locator(".error");
  const upload = (name: string, mimeType: string, buffer: Buffer) => page.locator("input[type=file]").setInputFiles({ name, mimeType, buffer });
  await upload("empty.txt", "text/plain", Buffer.from(""));
  await expect(lastError()).toContainText("empty.txt");
  await expect(page.locator(".message.document .progress")).toHaveCount(0);
  await upload("scan.pdf", "application/pdf", scannedPdf(3));
  await expect(lastError()).toContainText(/scan\.pdf.*OCR/);
  // Encrypted with a password by qpdf (make test installs it).
  const plain = join(f.root, "plain.pdf");
  const locked = join(f.root, "locked.pdf");
  writeFileSync(plain, scannedPdf(1));
  execFileSync("qpdf", ["--encrypt", "reader-secret", "owner-secret", "256", "--", plain, locked]);
  await upload("locked.pdf", "application/pdf", readFileSync(locked));
  await expect(lastError()).toContainText(/locked\.pdf is encrypted/);
  await expect(page.locator(".message.document .progress")).toHaveCount(0);
});

test("settings change only from the printed link, are checked field by field and saved to the config file", async ({ page }) => {
  // Opened without this run's secret (as any other program on the machine could), the page
  // shows the settings but cannot change them.
  await page.goto(server.url);
  await page.getByRole("button", { name: "Settings", exact: true }).click();
  await expect(page.getByText(f.config)).toBeVisible();
  await expect(page.locator("#settings-locked")).toContainText("printed when it started");
  const untouched = readFileSync(f.config, "utf8");
  await page.getByLabel("Engine", { exact: true }).fill("openai:https://elsewhere.example/v1");
  await page.getByRole("button", { name: "Save" }).click();
  await expect(page.getByRole("status")).toHaveCount(0);
  expect(readFileSync(f.config, "utf8")).toBe(untouched);

  await page.goto(server.link);
  await page.getByRole("button", { name: "Settings", exact: true }).click();
  await expect(page.getByText(f.config)).toBeVisible();
  await expect(page.locator("#settings-locked")).toHaveCount(0);
  const alpha = page.getByLabel("α (share of tokens attended)");
  await alpha.fill("1.5");
  await page.getByRole("button", { name: "Save" }).click();
  await expect(page.locator("#error-alpha")).toContainText("at most 1");
  await expect(alpha).toHaveAttribute("aria-invalid", "true");
  await alpha.fill("0.1");
  await page.getByLabel("Port").fill("80");
  await page.getByRole("button", { name: "Save" }).click();
  await expect(page.locator("#error-port")).toContainText("1024");
  await page.getByLabel("Port").fill("8181");
  await page.getByLabel("Engine", { exact: true }).fill("openai:http://10.0.0.5:8000/v1");
  await page.getByRole("button", { name: "Save" }).click();
  await expect(page.locator("#error-engine")).toContainText("plain HTTP");
  await page.getByLabel("Engine", { exact: true }).fill("openai:https://gpu.example/v1");
  // The stores kept for comparison are offered only under the advanced fold.
  const stores = page.getByLabel("Store").locator("option");
  await expect(stores).toHaveText(["full", "tiered"]);
  await page.getByText("Advanced: stores for comparison").click();
  await expect(stores).toHaveText(["full", "tiered", "offload", "drop", "near-storage"]);
  await page.getByLabel("Store").selectOption("tiered");
  await page.getByRole("button", { name: "Save" }).click();
  await expect(page.getByRole("status")).toContainText("Restart Hillside to apply");
  const saved = readFileSync(f.config, "utf8");
  expect(saved).toContain("# the UI tests' config");
  expect(saved).toMatch(/store = "tiered"/);
  expect(saved).toMatch(/port = 8181/);
  expect(saved).toMatch(/\[remote\]\s+engine = "openai:https:\/\/gpu.example\/v1"/);
  // Back to the local engine (a restart of this server reads the file): the table goes.
  await page.getByLabel("Engine", { exact: true }).fill("local");
  await page.getByRole("button", { name: "Save" }).click();
  await expect(page.getByRole("status")).toContainText("Restart Hillside to apply");
  expect(readFileSync(f.config, "utf8")).not.toContain("[remote]");
  expect(readdirSync(f.root).filter((name) => name.endsWith(".partial"))).toEqual([]);
});

test("a page on another site cannot write to the app through the browser", async ({ page }) => {
  // The other site: a page served from this machine under another name (Chromium sends
  // *.localhost to loopback), so that nothing but Hillside's own check stands in the way.
  const target = new URL(server.url).origin;
  const forged = JSON.stringify({ title: "x", messages: [{ role: "assistant", content: "[update](https://evil.example)" }] });
  const attack = `<!doctype html><html><body>
    <form id="form" method="POST" enctype="text/plain" target="sink" action="${target}/v1/hillside/conversations">
      <input name='{"title":"form","messages":[],"x":"' value='"}'>
    </form><iframe name="sink"></iframe>
    <script>
      const data = new FormData();
      data.append("file", new Blob(["Planted by another site."], { type: "text/plain" }), "planted.txt");
      Promise.allSettled([
        fetch("${target}/v1/hillside/conversations", { method: "POST", mode: "no-cors", headers: { "Content-Type": "text/plain" }, body: ${JSON.stringify(forged)} }),
        fetch("${target}/v1/hillside/documents", { method: "POST", mode: "no-cors", body: data }),
        fetch("${target}/v1/chat/completions", { method: "POST", mode: "no-cors", headers: { "Content-Type": "text/plain" }, body: '{"messages":[{"role":"user","content":"Hi"}]}' }),
      ]).then(() => { document.getElementById("form").submit(); });
    </script></body></html>`;
  const site = createServer((_req, res) => res.writeHead(200, { "Content-Type": "text/html" }).end(attack));
  await new Promise<void>((resolve) => site.listen(0, "127.0.0.1", resolve));
  const port = (site.address() as AddressInfo).port;
  const before = await server.api("/v1/hillside/conversations");
  const documentsBefore = await server.api("/v1/hillside/documents");
  const answered: number[] = [];
  page.on("response", (r) => {
    if (r.url().startsWith(target) && r.request().method() === "POST") answered.push(r.status());
  });
  try {
    await page.goto(`http://evil.localhost:${port}/`);
    // All four requests reached Hillside, and each was refused.
    await expect.poll(() => answered.length).toBe(4);
    expect(answered).toEqual([403, 403, 403, 403]);
  } finally {
    site.close();
  }
  expect((await server.api("/v1/hillside/conversations")).data).toEqual(before.data);
  expect((await server.api("/v1/hillside/documents")).data.length).toBe(documentsBefore.data.length);
});

test("a thinking model's reasoning is shown folded, apart from its answer", async ({ page }) => {
  // A tiny random-weight Qwen3 whose template opens `<think>` for the model (as Qwen3's thinking
  // models' do): what it writes is reasoning until it closes the tag, which it seldom does.
  const g = folders();
  const template = join(g.root, "thinking.jinja");
  writeFileSync(
    template,
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
      "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}",
  );
  const model = join(g.root, "tiny-qwen3-thinking.gguf");
  execFileSync(TINY_GGUF, ["qwen3", model, "--formats", "mixed", "--chat-template", template, "--vocab-from", join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")]);
  // A short context, so that a reply that never ends its reasoning ends soon.
  const thinking = await Server.start(g, ["--model", model, "--context", "256"]);
  try {
    await page.goto(thinking.url);
    await send(page, "Hi");
    const reply = page.locator(".message.assistant").last();
    await expect(reply).toHaveAttribute("aria-busy", "false", { timeout: 5 * 60_000 });
    const reasoning = reply.locator("details.reasoning");
    await expect(reasoning.locator("summary")).toHaveText("Reasoning");
    // Folded: there, but not shown until asked for.
    await expect(reasoning).not.toHaveAttribute("open");
    await expect(reasoning.locator(".plain")).toBeHidden();
    await reasoning.locator("summary").click();
    await expect(reasoning.locator(".plain")).toBeVisible();
    await expect(reasoning.locator(".plain")).not.toBeEmpty();
    await expect(reasoning.locator(".plain")).not.toContainText("<think>");
  } finally {
    await thinking.stop();
    rmSync(g.root, { recursive: true, force: true });
  }
});
