//! The cold pool on a filesystem that is full or read-only: a clear error, nothing left behind
//! (inside a private mount namespace (`unshare`), on small tmpfs mounts made for the test); and
//! on a drive of 4 KiB sectors, where an 8-bit pool's 512-byte units cannot go direct.

use hillside_engine::kv::cold::format::ColdType;
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
    let base_scratch = tempfile::Builder::new().prefix("hillside-fs-").tempdir().unwrap();
    let base = base_scratch.path().to_path_buf();
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

/// A loop device of 4 KiB logical sectors with an ext4 filesystem, mounted at `mount`; undone
/// when dropped.
struct FourKiBDrive {
    image: PathBuf,
    device: String,
    mount: PathBuf,
}

impl FourKiBDrive {
    fn new(base: &Path) -> Self {
        let (image, mount) = (base.join("drive.img"), base.join("mnt"));
        std::fs::create_dir_all(&mount).unwrap();
        std::fs::File::create(&image).unwrap().set_len(64 << 20).unwrap();
        let out = Command::new("losetup")
            .args(["--find", "--show", "--sector-size", "4096"])
            .arg(&image)
            .output()
            .expect("losetup (util-linux) runs");
        assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        let device = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let drive = Self { image, device, mount };
        assert!(Command::new("mkfs.ext4").args(["-q", "-F", &drive.device]).status().unwrap().success(), "mkfs.ext4");
        assert!(Command::new("mount").arg(&drive.device).arg(&drive.mount).status().unwrap().success(), "mount");
        drive
    }
}

impl Drop for FourKiBDrive {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = Command::new("losetup").args(["--detach", &self.device]).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

#[test]
fn an_8_bit_pool_on_a_drive_of_4_kib_sectors_reads_and_writes_buffered() {
    let base_scratch = tempfile::Builder::new().prefix("hillside-4kn-").tempdir().unwrap();
    let base = base_scratch.path().to_path_buf();
    let drive = FourKiBDrive::new(&base);
    // 2,560-byte groups: direct I/O there would fail every write with EINVAL.
    let layout = ColdLayout { cold_type: ColdType::Q8, ..ColdLayout::f16(2, 3, 64, 40) };
    assert_eq!(layout.disk_group_bytes(), 2560);
    let pool = ColdPool::create(&drive.mount, layout).unwrap();
    let mut groups = pool.buffer(3);
    groups
        .as_u16_mut()
        .iter_mut()
        .enumerate()
        .for_each(|(i, w)| *w = half::f16::from_f32((i % 200) as f32 / 100.0 - 1.0).to_bits());
    pool.write_groups(1, 2, 5, 3, groups.as_bytes()).unwrap();
    let mut back = pool.buffer(3);
    pool.read_groups(1, 2, 5, 3, back.as_bytes_mut()).unwrap();
    let value = |w: u16| half::f16::from_bits(w).to_f32();
    assert!(
        groups.as_u16().iter().zip(back.as_u16()).all(|(&a, &b)| (value(a) - value(b)).abs() <= 1.0 / 127.0),
        "within half a step"
    );
    drop(pool);
    // f16 pages are whole sectors there: direct I/O as anywhere.
    let pool = ColdPool::create(&drive.mount, ColdLayout::f16(1, 1, 64, 4)).unwrap();
    pool.write_group(0, 0, 1, &groups).unwrap();
    pool.read_groups(0, 0, 1, 1, back.as_bytes_mut()).unwrap();
    assert_eq!(back.as_bytes()[..4096], groups.as_bytes()[..4096]);
    drop(pool);
    drop(drive);
}
