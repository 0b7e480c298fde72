// The UI's tour: screenshots of the chat, a document summary with a source, and the KV tier view
// for docs/ (shown in the README), and the time to the first paint once the server is up.

import { expect, test } from "@playwright/test";
import { mkdirSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { folders, Server } from "../tests/server";

const docs = fileURLToPath(new URL("../../docs/", import.meta.url));
const GPL = fileURLToPath(new URL("../../../shared/data/gpl-3.0.txt", import.meta.url));

test("tour", async ({ page }) => {
  mkdirSync(`${docs}screenshots`, { recursive: true });
  const f = folders(`store = "tiered"\n`);
  const server = await Server.start(f);
  try {
    // First paint, from the navigation's start (the server is up and idle).
    await page.goto(server.url);
    const paint = await page.evaluate(
      () =>
        new Promise<number>((resolve) => {
          const seen = performance.getEntriesByName("first-contentful-paint")[0];
          if (seen) return resolve(seen.startTime);
          new PerformanceObserver((list) => resolve(list.getEntries()[0].startTime)).observe({ type: "paint", buffered: true });
        }),
    );
    const loaded = await page.evaluate(() => (performance.getEntriesByType("navigation")[0] as PerformanceNavigationTiming).loadEventEnd);
    await expect(page.locator(".topbar")).toContainText("tokens of context");
    const ready = await page.evaluate(() => performance.now());
    writeFileSync(`${docs}bench-ui-paint.json`, JSON.stringify({ date: new Date().toISOString(), first_contentful_paint_ms: paint, load_event_ms: loaded, model_shown_ms: ready }, null, 2) + "\n");
    console.log(`first contentful paint ${paint.toFixed(0)} ms, load ${loaded.toFixed(0)} ms, model shown ${ready.toFixed(0)} ms`);

    const prompt = page.getByLabel("Message", { exact: true });
    await prompt.fill("Write a Python function that checks whether a number is prime, with a short explanation.");
    await page.keyboard.press("Enter");
    await expect(page.locator(".message.assistant").last().locator(".tokens-per-second")).toBeVisible();
    await page.screenshot({ path: `${docs}screenshots/chat.png` });

    await page.getByRole("button", { name: "New chat" }).click();
    await page.locator("input[type=file]").setInputFiles(GPL);
    const card = page.locator(".message.document").last();
    await expect(card.locator(".points li").first()).toBeVisible();
    await prompt.fill("Can I sell copies of a program under this license?");
    await page.keyboard.press("Enter");
    await expect(page.locator(".message.assistant").last().locator(".document-reuse")).toBeVisible();
    await card.locator("button.source").nth(1).click();
    await expect(page.getByRole("dialog")).toBeVisible();
    await page.screenshot({ path: `${docs}screenshots/document.png` });
    await page.keyboard.press("Escape");

    // A question about the GPL in the background (7,700 tokens in the tiered store, most of them
    // cold) while the tier view watches.
    const { data } = await server.api("/v1/hillside/documents");
    const long = fetch(`${server.url}v1/chat/completions`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({
        messages: [{ role: "user", content: "Explain in detail what this license says about distributing modified versions." }],
        hillside: { documents: [data[0].id] },
        max_tokens: 400,
        temperature: 0,
      }),
    });
    await page.getByRole("button", { name: "KV tiers" }).click();
    await expect(page.locator(".chart").first()).toBeVisible();
    await page.waitForTimeout(20_000);
    await page.screenshot({ path: `${docs}screenshots/kv-tiers.png` });
    await long;
  } finally {
    await server.stop();
  }
});
