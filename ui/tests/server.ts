// A real `hillside serve` for the UI tests: the binary `make` built (HILLSIDE_BIN), a free
// port, its own data folder, config file and cold-pool folder, stopped with SIGTERM.

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export interface Folders {
  root: string;
  config: string;
  data: string;
}

export function folders(extraConfig = ""): Folders {
  const root = mkdtempSync(join(tmpdir(), "hillside-ui-"));
  const config = join(root, "config.toml");
  writeFileSync(config, `# the UI tests' config\ncontext = 2048\n\n[kv]\ncold_dir = "${join(root, "cold")}"\n${extraConfig}`);
  return { root, config, data: join(root, "data") };
}

export class Server {
  private constructor(
    /** The server's address, as a user who typed it would open it. */
    readonly url: string,
    /** The link it printed: the address with this run's control secret. */
    readonly link: string,
    private readonly child: ChildProcess,
    readonly log: string[],
  ) {}

  static async start(f: Folders, args: string[] = [], env: Record<string, string> = {}): Promise<Server> {
    const bin = process.env.HILLSIDE_BIN;
    if (!bin) throw new Error("HILLSIDE_BIN must name the hillside binary (make ui-test sets it)");
    const child = spawn(bin, ["serve", "--port", "0", "--documents-dir", f.data, ...args], {
      env: { ...process.env, HILLSIDE_CONFIG: f.config, RUST_LOG: "warn", ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const log: string[] = [];
    const [url, link] = await new Promise<[string, string]>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`the server did not start:\n${log.join("")}`)), 5 * 60_000);
      child.stderr!.on("data", (d) => log.push(String(d)));
      child.stdout!.on("data", (d) => {
        log.push(String(d));
        const m = /web UI at ((http:\/\/127\.0\.0\.1:\d+\/)#secret=[0-9a-f]+)\n/.exec(log.join(""));
        if (m) {
          clearTimeout(timer);
          resolve([m[2], m[1]]);
        }
      });
      child.on("exit", (code) => reject(new Error(`the server exited (${code}) before serving:\n${log.join("")}`)));
    });
    return new Server(url, link, child, log);
  }

  async api(path: string, init?: RequestInit): Promise<any> {
    const r = await fetch(new URL(path, this.url), init);
    return r.json();
  }

  /** SIGTERM, then waits for the exit (its in-flight work is given up to its grace period). */
  async stop(): Promise<number | null> {
    if (this.child.exitCode !== null) return this.child.exitCode;
    const exited = new Promise<number | null>((resolve) => this.child.on("exit", (code) => resolve(code)));
    this.child.kill("SIGTERM");
    return exited;
  }
}
