import { defineConfig } from "vite";
import preact from "@preact/preset-vite";

// The build goes to dist/, which hillside-server embeds (server/build.rs). No inline scripts or
// styles, so the server's content-security policy can forbid them.
export default defineConfig({
  plugins: [preact()],
  build: { outDir: "dist", emptyOutDir: true, assetsInlineLimit: 0, modulePreload: { polyfill: false } },
  server: { proxy: { "/v1": "http://127.0.0.1:8080", "/health": "http://127.0.0.1:8080" } },
});
