//! The document library on a real file: entries round-trip, the same bytes are one document,
//! a summary's steps are kept until it finishes, and a process killed with SIGKILL in the middle of adding leaves every committed document
//! whole.

use hillside_documents::sources::Point;
use hillside_documents::{read_bytes, Library, Limits};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

const CHILD: &str = "HILLSIDE_TEST_LIBRARY_CHILD";

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("hillside-library-{name}-{}", std::process::id()))
}

fn note(i: usize) -> (String, Vec<u8>) {
    (format!("note-{i}.md"), format!("# Note {i}\n{}\n", "Remember the milk. ".repeat(200 + i)).into_bytes())
}

#[test]
fn entries_round_trip_and_the_same_bytes_are_one_document() {
    let dir = temp("round-trip");
    let lib = Library::open(&dir.join("library.redb")).unwrap();
    let (name, bytes) = note(1);
    let doc = read_bytes(&name, &bytes, &Limits::default()).unwrap();
    let added = lib.add(&doc, &bytes).unwrap();
    assert!(added.created);
    let entry = added.entry;
    assert_eq!((entry.id.len(), entry.size_bytes, entry.parts.len()), (16, bytes.len() as u64, 1));
    assert_eq!(lib.text(&entry.id).unwrap().as_deref(), Some(doc.text.as_str()));
    let renamed = read_bytes("copy.md", &bytes, &Limits::default()).unwrap();
    let again = lib.add(&renamed, &bytes).unwrap();
    assert!(!again.created);
    let again = again.entry;
    assert_eq!(
        (again.id.as_str(), again.name.as_str(), again.created_s),
        (entry.id.as_str(), "copy.md", entry.created_s)
    );
    assert_eq!(lib.list().unwrap().len(), 1);
    let points = vec![Point { text: "About milk.".into(), sources: Vec::new() }];
    let summarized = lib.update(&entry.id, |e| e.summary = Some(points.clone())).unwrap().unwrap();
    assert_eq!(summarized.summary.as_ref(), Some(&points));
    drop(lib);
    // Reopened: still there.
    let lib = Library::open(&dir.join("library.redb")).unwrap();
    assert_eq!(lib.get(&entry.id).unwrap().unwrap().summary, Some(points));
    assert!(lib.remove(&entry.id).unwrap() && !lib.remove(&entry.id).unwrap());
    assert!(lib.list().unwrap().is_empty() && lib.text(&entry.id).unwrap().is_none());
    let _ = std::fs::remove_dir_all(dir);
}

/// A summary's kept steps: added one by one, replaced by another plan's, gone with the
/// finished summary (in the same transaction) or with the document, never kept for a removed one.
#[test]
fn a_summarys_steps_are_kept_until_it_finishes_or_the_document_goes() {
    let dir = temp("checkpoints");
    let lib = Library::open(&dir.join("library.redb")).unwrap();
    let (name, bytes) = note(2);
    let id = lib.add(&read_bytes(&name, &bytes, &Limits::default()).unwrap(), &bytes).unwrap().entry.id;
    assert_eq!(lib.checkpoint(&id).unwrap(), None);
    lib.keep_step(&id, "plan-a", 3, "chunk 0", "- one").unwrap();
    lib.keep_step(&id, "plan-a", 3, "chunk 2", "- three").unwrap();
    let kept = lib.checkpoint(&id).unwrap().unwrap();
    assert_eq!(
        (kept.plan_key.as_str(), kept.chunks, kept.chunks_done(), kept.notes["chunk 2"].as_str()),
        ("plan-a", 3, 2, "- three")
    );
    lib.keep_step(&id, "plan-b", 5, "chunk 1", "- two").unwrap();
    let kept = lib.checkpoint(&id).unwrap().unwrap();
    assert_eq!(
        (kept.plan_key.as_str(), kept.chunks, kept.notes.len()),
        ("plan-b", 5, 1),
        "another plan's notes are dropped"
    );
    let points = vec![Point { text: "About milk.".into(), sources: Vec::new() }];
    let entry = lib.finish_summary(&id, points.clone(), 1234).unwrap().unwrap();
    assert_eq!((entry.summary, entry.tokens), (Some(points), Some(1234)));
    assert_eq!(lib.checkpoint(&id).unwrap(), None);
    lib.keep_step(&id, "plan-b", 5, "chunk 1", "- two").unwrap();
    assert!(lib.remove(&id).unwrap());
    assert_eq!(lib.checkpoint(&id).unwrap(), None, "removed with its document");
    lib.keep_step(&id, "plan-b", 5, "chunk 3", "- four").unwrap();
    assert_eq!(lib.checkpoint(&id).unwrap(), None, "nothing is kept for a removed document");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn adding_a_known_document_keeps_what_was_stored_meanwhile() {
    let dir = temp("add-race");
    let lib = Library::open(&dir.join("library.redb")).unwrap();
    let (name, bytes) = note(3);
    let doc = read_bytes(&name, &bytes, &Limits::default()).unwrap();
    let id = lib.add(&doc, &bytes).unwrap().entry.id;
    lib.update(&id, |e| e.tokens = Some(0)).unwrap();
    let rounds = 1000;
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..rounds {
                lib.add(&doc, &bytes).unwrap();
            }
        });
        // Each change made while the file is added again (a summary stored, the token count
        // set) must survive: an add that read the entry before a change and wrote after it
        // would undo it, and the count would come up short.
        for _ in 0..rounds {
            lib.update(&id, |e| e.tokens = Some(e.tokens.unwrap_or(0) + 1)).unwrap();
        }
    });
    assert_eq!(lib.get(&id).unwrap().unwrap().tokens, Some(rounds));
    drop(lib);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_process_killed_while_adding_leaves_every_committed_document_whole() {
    if let Some(path) = std::env::var_os(CHILD) {
        // The child: add notes until killed, saying after each commit which one it was.
        let lib = Library::open(&PathBuf::from(path)).unwrap();
        for i in 0.. {
            let (name, bytes) = note(i);
            lib.add(&read_bytes(&name, &bytes, &Limits::default()).unwrap(), &bytes).unwrap();
            println!("{i}");
        }
    }
    let dir = temp("kill");
    let path = dir.join("library.redb");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["a_process_killed_while_adding_leaves_every_committed_document_whole", "--exact", "--nocapture"])
        .env(CHILD, &path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Kill it mid-stream, once it has committed a few.
    let committed = lines
        .by_ref()
        .map_while(Result::ok)
        .filter_map(|l| l.trim().parse::<usize>().ok())
        .nth(20)
        .expect("the child commits notes");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let lib = Library::open(&path).unwrap();
    let entries = lib.list().unwrap();
    assert!(entries.len() > committed, "{} entries, {committed} reported committed", entries.len());
    for entry in &entries {
        let text = lib.text(&entry.id).unwrap().unwrap_or_else(|| panic!("{} has no text", entry.name));
        let i: usize = entry.name.trim_start_matches("note-").trim_end_matches(".md").parse().unwrap();
        let (_, bytes) = note(i);
        assert_eq!(text.as_bytes(), bytes.as_slice(), "{} is whole", entry.name);
    }
    let _ = std::fs::remove_dir_all(dir);
}
