//! `hillside-xrt-probe`, the process the XRT probe runs: its report, whatever XRT prints, and
//! its answer to bad arguments. (Building this test also builds the helper where the SmartSSD
//! tests find it, beside their own binaries.)

use std::process::Command;

fn helper() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hillside-xrt-probe"))
}

#[test]
fn the_helper_reports_a_missing_library_as_json_on_stdout() {
    let out = helper().args(["--library", "/nonexistent/libxrt_coreutil.so", "--device", "0"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["library"], "/nonexistent/libxrt_coreutil.so");
    assert_eq!(report["cards"], 0);
    assert!(report["problem"].as_str().unwrap().starts_with("no XRT"), "{report}");
}

#[test]
fn bad_arguments_are_a_usage_error() {
    for args in [&["--device", "first"][..], &["--library"][..], &["--speed", "9"][..]] {
        let out = helper().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "no report for {args:?}");
    }
}
