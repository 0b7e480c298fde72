//! A bounded fuzz run over the ingestion entry point ([`read_bytes`]): documents of every
//! format with bytes flipped, cut, repeated and spliced in, and markup nested at random. Whatever
//! comes in, the reader answers — a document within the limits, or an error that says why —
//! and never panics. The run is a fixed number of cases from a fixed seed, so `make test`
//! spends the same few seconds on it each time; `PROPTEST_CASES` runs more.

mod common;

use common::{docx, epub, nested_html, pdf, zip};
use hillside_documents::{read_bytes, IngestError, Limits};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("minutes.pdf", pdf(&[&["Minutes of the harbour board."], &["A second page."]])),
        ("lease.docx", docx()),
        ("voyage.epub", epub()),
        ("page.html", nested_html("div", 30).into_bytes()),
        ("notes.md", b"# Notes\n\nThe tide came in.\n\n## Later\n\nIt went out.\n".to_vec()),
        ("latin1.txt", b"Caf\xe9 cr\xe8me, na\xefve fa\xe7ade.\n".to_vec()),
        (
            "mixed.zip",
            zip(&[
                ("word/document.xml", "<w:document><w:body><w:p><w:r><w:t>x</w:t></w:r></w:p></w:body></w:document>"),
                ("META-INF/container.xml", "<container/>"),
            ]),
        ),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    /// XOR the byte at this share of the file with a mask.
    Flip(f64, u8),
    /// Keep only this share of the file.
    Cut(f64),
    /// Repeat the span from this share, of this length, this many times.
    Repeat(f64, usize, usize),
    /// Put these bytes at this share.
    Insert(f64, Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let markup = prop::sample::select(vec![
        &b"<div>"[..],
        b"</div>",
        b"<b><i>",
        b"<w:p>",
        b"<![CDATA[",
        b"<!--",
        b"\"",
        b"&#x",
        b"PK\x03\x04",
        b"%PDF-",
        b"endobj",
        b"<<",
        b"/Length 999999",
    ]);
    prop_oneof![
        (0.0..1.0, any::<u8>()).prop_map(|(at, mask)| Mutation::Flip(at, mask)),
        (0.0..1.0).prop_map(Mutation::Cut),
        (0.0..1.0, 1usize..64, 1usize..2_000).prop_map(|(at, len, times)| Mutation::Repeat(at, len, times)),
        (0.0..1.0, prop_oneof![markup.prop_map(<[u8]>::to_vec), prop::collection::vec(any::<u8>(), 1..32)])
            .prop_map(|(at, bytes)| Mutation::Insert(at, bytes)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let at = |share: f64, len: usize| ((share * len as f64) as usize).min(len);
    match m {
        Mutation::Flip(share, mask) => {
            if !bytes.is_empty() {
                let i = at(*share, bytes.len() - 1);
                bytes[i] ^= mask;
            }
        }
        Mutation::Cut(share) => bytes.truncate(at(*share, bytes.len())),
        Mutation::Repeat(share, len, times) => {
            let start = at(*share, bytes.len());
            let span = bytes[start..(start + len).min(bytes.len())].to_vec();
            let tail = bytes.split_off(start);
            bytes.extend(std::iter::repeat_n(span, *times).flatten());
            bytes.extend(tail);
        }
        Mutation::Insert(share, insert) => {
            let i = at(*share, bytes.len());
            bytes.splice(i..i, insert.iter().copied());
        }
    }
}

#[test]
fn any_mutation_of_a_document_is_read_or_refused() {
    let seeds = seeds();
    let limits = Limits::default();
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(400);
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let strategy = (0..seeds.len(), prop::collection::vec(mutation(), 1..6));
    runner
        .run(&strategy, |(seed, mutations)| {
            let (name, mut bytes) = seeds[seed].clone();
            for m in &mutations {
                apply(&mut bytes, m);
            }
            match read_bytes(name, &bytes, &limits) {
                Ok(doc) => {
                    prop_assert!(!doc.text.trim().is_empty() && doc.text.len() <= limits.max_text_bytes);
                    prop_assert!(
                        doc.parts.iter().all(|p| p.bytes.start <= p.bytes.end && p.bytes.end <= doc.text.len()),
                        "parts outside the text: {:?}",
                        doc.parts
                    );
                }
                Err(IngestError::Io { .. }) => prop_assert!(false, "an in-memory read has no I/O"),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn random_nesting_is_read_or_refused() {
    let config = Config { cases: 64, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &[11; 32]));
    let tags = prop::sample::select(vec![
        "div",
        "blockquote",
        "b",
        "i",
        "table",
        "tr",
        "td",
        "li",
        "ul",
        "p",
        "svg",
        "x-custom",
        "a",
    ]);
    let strategy = (prop::collection::vec((tags, any::<bool>()), 1..100), 1usize..500);
    runner
        .run(&strategy, |(pattern, repeats)| {
            let body: String = pattern
                .iter()
                .map(|(tag, closes)| if *closes { format!("</{tag}>") } else { format!("<{tag}>x") })
                .collect::<String>()
                .repeat(repeats);
            let html = format!("<!doctype html><html><body>{body}</body></html>");
            match read_bytes("page.html", html.as_bytes(), &Limits::default()) {
                Ok(_) | Err(IngestError::OverLimit { .. }) | Err(IngestError::NoText { .. }) => Ok(()),
                Err(e) => Err(TestCaseError::fail(format!("unexpected: {e}"))),
            }
        })
        .unwrap();
}
