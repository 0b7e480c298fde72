//! Hillside's desktop app: the engine and the server run in this process on 127.0.0.1, and the
//! window shows the server's web UI, so that the window and a browser share one code path (and
//! other tools can use the same endpoint while the window is open).

mod core;

fn main() {
    hillside_common::configure_allocator();
    hillside_common::private_by_default();
    hillside_common::init_logging();
    if let Err(e) = core::run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
