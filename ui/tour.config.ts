import { defineConfig } from "@playwright/test";

// `npm run tour` (make ui-tour): the screenshots in docs/ and the UI's first paint, against a
// real `hillside serve` with the tiered store. Not a test: it asserts only that each step shows.
export default defineConfig({
  testDir: "tour",
  timeout: 20 * 60_000,
  expect: { timeout: 5 * 60_000 },
  workers: 1,
  reporter: [["list"]],
  use: {
    viewport: { width: 1100, height: 720 },
    colorScheme: "light",
    launchOptions: { executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium" },
  },
});
