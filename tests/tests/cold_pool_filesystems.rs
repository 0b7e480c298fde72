//! The cold pool on a filesystem that is full or read-only: a clear error, nothing left behind.
//! Runs inside a private mount namespace (`unshare`) on small tmpfs mounts made for the test.

use hillside_engine::kv::cold::{ColdLayout, ColdPool};
use std::path::{Path, PathBuf};
use std::process::Command;

const IN_NAMESPACE: &str = "HILLSIDE_TEST_IN_MOUNT_NS";

fn mount_tmpfs(dir: &Path, options: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let status = Command::new("mount").args(["-t", "tmpfs", "-o", options, "hillside-test"]).arg(dir).status().unwrap();
    assert!(status.success(), "mount tmpfs on {}", dir.display());
}

#[test]
fn full_and_read_only_filesystems_are_clear_errors() {
    if std::env::var_os(IN_NAMESPACE).is_none() {
        // Re-run just this test as root of a new user and mount namespace, where it may mount.
        let status = Command::new("unshare")
            .args(["--user", "--map-root-user", "--mount"])
            .arg(std::env::current_exe().unwrap())
            .args(["full_and_read_only_filesystems_are_clear_errors", "--exact", "--nocapture"])
            .env(IN_NAMESPACE, "1")
            .status()
            .expect("unshare (util-linux) runs");
        assert!(status.success(), "the test failed inside its mount namespace (see above)");
        return;
    }
    let base: PathBuf = std::env::temp_dir().join(format!("hillside-fs-{}", std::process::id()));
    // 30 layers × 3 heads × 512 groups × 4 KiB = 184 MB wanted; the filesystem has 1 MB.
    let layout = ColdLayout::f16(30, 3, 64, 512);

    let full = base.join("full");
    mount_tmpfs(&full, "size=1m");
    let err = ColdPool::create(&full, layout).err().expect("a 1 MB filesystem cannot hold the pool");
    assert!(err.is_storage_full(), "{err:?}");
    let err = err.to_string();
    eprintln!("full: {err}");
    assert!(err.contains("disk is full") && err.contains("MB"), "{err}");
    assert!(!err.contains(&*full.to_string_lossy()), "the message, which can reach a client, names no path: {err}");
    assert_eq!(std::fs::read_dir(&full).unwrap().count(), 0, "no partial file left behind");

    let read_only = base.join("read-only");
    mount_tmpfs(&read_only, "size=1m,ro");
    let err = ColdPool::create(&read_only, layout).err().expect("read-only").to_string();
    eprintln!("read-only: {err}");
    assert!(err.contains("writable cold-pool directory"), "{err}");

    // A pool that fits works there (buffered where the kernel's tmpfs refuses O_DIRECT).
    let small = ColdLayout::f16(1, 1, 64, 4);
    let pool = ColdPool::create(&full, small).unwrap();
    let mut buf = pool.buffer(1);
    buf.as_u16_mut()[5] = 42;
    pool.write_group(0, 0, 2, &buf).unwrap();
    let mut back = pool.buffer(1);
    pool.read_groups(0, 0, 2, 1, back.as_bytes_mut()).unwrap();
    assert_eq!(back.as_u16()[5], 42);
}
