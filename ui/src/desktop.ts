// In the desktop app (Tauri), files dropped on the window arrive as paths: the app lets the
// server read exactly those (the user chose them) and tells the page. In a browser this is
// absent and a drop uploads the files' bytes instead.

interface Desktop {
  /** Calls `f` with the paths of each drop; returns what stops listening. */
  onFilesDropped(f: (paths: string[]) => void): () => void;
  /** Why the app's endpoint is not on its configured port, if it is not. */
  notice(): Promise<string | null>;
}

const tauri = (window as any).__TAURI__;

export const desktop: Desktop | null = tauri
  ? {
      onFilesDropped(f) {
        const unlisten = tauri.event.listen("hillside://files-dropped", (e: { payload: { paths: string[] } }) => f(e.payload.paths));
        return () => void unlisten.then((stop: () => void) => stop());
      },
      async notice() {
        const info: { notice: string | null } = await tauri.core.invoke("server_info");
        return info.notice;
      },
    }
  : null;
