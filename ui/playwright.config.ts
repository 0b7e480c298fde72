import { defineConfig } from "@playwright/test";

// The UI against a real `hillside serve` (the real model), in Debian's Chromium, headless.
// Timeouts only catch hangs: a summary on a slow machine takes minutes.
export default defineConfig({
  testDir: "tests",
  testMatch: /\.spec\.ts$/,
  timeout: 15 * 60_000,
  expect: { timeout: 3 * 60_000 },
  workers: 1,
  reporter: [["list"]],
  use: {
    viewport: { width: 800, height: 600 },
    launchOptions: { executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium" },
    trace: "retain-on-failure",
  },
});
