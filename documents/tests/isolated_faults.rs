//! What each way the isolated reader can die costs: one refused file that says why, and the
//! next file reads as ever. The failures are asked of the child through its environment, which
//! every child of this process inherits, so this binary holds this one test alone.

use hillside_documents::ingest::isolated::{IsolatedReader, ProcessLimits, FAULT_VARIABLE};
use hillside_documents::ingest::Bound;
use hillside_documents::{IngestError, Limits};
use std::path::PathBuf;
use std::time::Instant;

fn reader(process: ProcessLimits) -> IsolatedReader {
    IsolatedReader::new(PathBuf::from(env!("CARGO_BIN_EXE_hillside-ingest")), process)
}

fn reader_with_wall(wall_s: u64) -> IsolatedReader {
    reader(ProcessLimits { wall_s, ..ProcessLimits::default() })
}

#[test]
fn a_child_that_dies_costs_one_refused_file() {
    let small = ProcessLimits { memory_bytes: 256 << 20, cpu_s: 2, wall_s: 60, ..ProcessLimits::default() };
    let reader = reader(small);
    let (name, bytes, limits) = ("notes.txt", b"Notes from the harbour board.".as_slice(), Limits::default());
    let failed = |fault: &str| {
        std::env::set_var(FAULT_VARIABLE, fault);
        let started = Instant::now();
        let e = reader.read(name, bytes, &limits).unwrap_err();
        std::env::remove_var(FAULT_VARIABLE);
        eprintln!("{fault}: {e} ({:.2} s)", started.elapsed().as_secs_f64());
        e
    };
    let aborted = failed("abort");
    assert!(
        matches!(&aborted, IngestError::ReaderFailed { why, .. } if why.contains("crashed") && why.contains("signal 6")),
        "{aborted}"
    );
    let hoarded = failed("allocate");
    assert!(matches!(hoarded, IngestError::OverLimit { bound: Bound::Memory, .. }), "{hoarded}");
    assert!(hoarded.to_string().contains("256 MB"), "{hoarded}");
    let overflowed = failed("overflow");
    assert!(matches!(overflowed, IngestError::OverLimit { bound: Bound::NestingDepth, .. }), "{overflowed}");
    let spun = failed("spin");
    assert!(
        matches!(&spun, IngestError::OverLimit { bound: Bound::Time, what, .. } if what.contains("2 s of CPU")),
        "{spun}"
    );
    // A child that sleeps uses no CPU time: the wall-clock limit ends it.
    let sleepy = reader_with_wall(1);
    std::env::set_var(FAULT_VARIABLE, "sleep");
    let slept = sleepy.read(name, bytes, &limits).unwrap_err();
    std::env::remove_var(FAULT_VARIABLE);
    assert!(
        matches!(&slept, IngestError::OverLimit { bound: Bound::Time, what, .. } if what.contains("over 1 s")),
        "{slept}"
    );
    // And the next file reads as ever.
    assert!(reader.read(name, bytes, &limits).unwrap().text.contains("harbour board"));
}
