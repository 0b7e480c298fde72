//! Tauri's build step: the app's config, capabilities and the permission for its one command.

fn main() {
    let commands = tauri_build::AppManifest::new().commands(&["server_info"]);
    tauri_build::try_build(tauri_build::Attributes::new().app_manifest(commands)).expect("tauri build step");
}
