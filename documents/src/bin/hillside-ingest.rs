//! Reads one document in a process of its own, for a Hillside that must not be taken down by a
//! file: see `hillside_documents::ingest::isolated`.

fn main() -> std::process::ExitCode {
    hillside_documents::ingest::isolated::child_main()
}
