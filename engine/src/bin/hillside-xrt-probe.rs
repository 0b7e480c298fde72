//! Looks for a SmartSSD in a process of its own, for `hillside` (see the engine's
//! `score::xrt::probe`): XRT may abort the process that asks.

fn main() {
    std::process::exit(hillside_engine::score::xrt::probe::child_main(std::env::args_os().skip(1)));
}
