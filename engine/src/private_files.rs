//! Files and folders Hillside makes hold what users wrote or read: the cold pool's K/V map back to
//! a prompt's tokens, the library and conversations hold documents and chats. Each is made
//! readable by its owner only (0600, folders 0700), and never through a link: a file is created
//! with `O_EXCL` or opened with `O_NOFOLLOW`, and a file that is rewritten whole is written beside
//! itself and renamed over, which replaces a link rather than writing where it points.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// Makes `dir` and any missing parents, each 0700 (folders that exist are left as they are).
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Options for a private file that `open` creates (0600) and that is never a link.
pub fn options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    options
}

/// Creates `path` empty, private, unless it exists (a link there is refused): for a database
/// that then opens it.
pub fn ensure(path: &Path) -> std::io::Result<()> {
    options().read(true).write(true).create(true).open(path).map(drop)
}

/// The file's bytes, refusing a link.
pub fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    options().read(true).open(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Replaces `path` with `bytes` in one rename, private.
pub fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let partial = partial_path(path);
    // One a crash left behind; a link there is removed, not followed.
    match std::fs::remove_file(&partial) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let written = (|| {
        let mut file: File = options().write(true).create_new(true).open(&partial)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&partial, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

/// Where [`replace`] writes first: beside the file, named for this process.
fn partial_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.partial", std::process::id()));
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn files_and_folders_are_private_and_links_are_not_followed() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("a/b");
        create_dir(&dir).unwrap();
        assert_eq!((mode(&dir), mode(&scratch.path().join("a"))), (0o700, 0o700));
        let file = dir.join("profile.json");
        replace(&file, b"{}").unwrap();
        assert_eq!((mode(&file), read(&file).unwrap()), (0o600, b"{}".to_vec()));

        // A link planted where the file goes: reading refuses it, replacing puts a file in its
        // place, and what it pointed at is untouched.
        let target = scratch.path().join("elsewhere.txt");
        std::fs::write(&target, "the user's own file").unwrap();
        let link = dir.join("linked.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(read(&link).is_err());
        assert!(ensure(&link).is_err());
        replace(&link, b"{\"rate\": 1}").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_file());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "the user's own file");
        // A link planted where the partial file goes is not followed either.
        std::os::unix::fs::symlink(&target, partial_path(&file)).unwrap();
        replace(&file, b"[]").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "the user's own file");

        let db = dir.join("library.redb");
        ensure(&db).unwrap();
        assert_eq!(mode(&db), 0o600);
    }
}
