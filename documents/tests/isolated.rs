//! The isolated reader (`hillside-ingest`): the same documents as an in-process read, and
//! bounds that cross the process. What each way a reader can die costs is `isolated_faults.rs`.

mod common;

use common::{docx, epub, nested_html, pdf};
use hillside_documents::ingest::isolated::{IsolatedReader, ProcessLimits};
use hillside_documents::ingest::Bound;
use hillside_documents::{read_bytes, IngestError, Limits};
use std::path::PathBuf;
use std::time::Instant;

fn reader(process: ProcessLimits) -> IsolatedReader {
    IsolatedReader::new(PathBuf::from(env!("CARGO_BIN_EXE_hillside-ingest")), process)
}

#[test]
fn the_child_reads_what_the_process_itself_reads_and_refuses_what_it_refuses() {
    let reader = reader(ProcessLimits::default());
    let gpl = std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/gpl-3.0.txt")).unwrap();
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("gpl-3.0.txt", gpl),
        ("minutes.pdf", pdf(&[&["Minutes of the harbour board."], &["Second page of the minutes."]])),
        ("lease.docx", docx()),
        ("voyage.epub", epub()),
        ("page.html", nested_html("div", 40).into_bytes()),
    ];
    let limits = Limits::default();
    for (name, bytes) in &files {
        let started = Instant::now();
        let isolated = reader.read(name, bytes, &limits).unwrap_or_else(|e| panic!("{name}: {e}"));
        let elapsed = started.elapsed();
        assert_eq!(isolated, read_bytes(name, bytes, &limits).unwrap(), "{name}");
        eprintln!("{name}: {} bytes read in a child in {:.1} ms", bytes.len(), elapsed.as_secs_f64() * 1e3);
    }
    let refused = reader.read("deep.html", nested_html("blockquote", 50_000).as_bytes(), &limits).unwrap_err();
    assert!(matches!(refused, IngestError::OverLimit { bound: Bound::NestingDepth, .. }), "{refused}");
    let refused = reader.read("photo.txt", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", &limits).unwrap_err();
    assert!(matches!(refused, IngestError::Unsupported { .. }), "{refused}");
}

#[test]
fn a_missing_reader_is_said_plainly() {
    let reader = IsolatedReader::new(PathBuf::from("/nonexistent/hillside-ingest"), ProcessLimits::default());
    let e = reader.read("notes.txt", b"Notes.", &Limits::default()).unwrap_err();
    assert!(matches!(&e, IngestError::ReaderFailed { why, .. } if why.contains("cannot start")), "{e}");
}
