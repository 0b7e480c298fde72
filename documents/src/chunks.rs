//! How a document is summarized: whole, when it fits the model's context with room for the
//! instructions and the answer, else hierarchically, in chunks of about half the context cut at
//! section and paragraph boundaries, whose summaries are merged in groups, at most
//! [`MAX_LEVELS`] levels deep. Never cut silently: a document that would need more levels is
//! an error that says so.

use crate::ingest::Document;
use std::ops::Range;

/// Merge levels above the chunk summaries a hierarchical summary may take.
pub const MAX_LEVELS: usize = 3;

/// Tokens a chunk's summary and the evidence carried with it may take in a merge (longer
/// ones are cut to it), so that a merge of the most that fit is a known count.
pub const SUMMARY_WITH_EVIDENCE_TOKENS: usize = 400;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Mode {
    /// The whole text in one prompt.
    Whole,
    /// Chunks (byte ranges of the text), then at most `levels` rounds of merges (fewer when
    /// the chunks' summaries come out shorter than [`SUMMARY_WITH_EVIDENCE_TOKENS`]).
    Hierarchical { chunks: Vec<Range<usize>>, levels: usize },
}

impl Mode {
    /// As the API and the CLI name it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Whole => "whole",
            Self::Hierarchical { .. } => "hierarchical",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Plan {
    /// The document's tokens.
    pub tokens: usize,
    #[serde(flatten)]
    pub mode: Mode,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{name} is {tokens} tokens: summarizing it would take {levels} levels of merges (at most {MAX_LEVELS}); split it, or use a model with a longer context")]
pub struct TooLong {
    pub name: String,
    pub tokens: usize,
    pub levels: usize,
}

/// Plans the summary of `doc` for a model with `context_tokens`, keeping `reserve_tokens` for
/// the instructions and the answer; `count` gives a text's tokens.
pub fn plan(
    doc: &Document,
    context_tokens: usize,
    reserve_tokens: usize,
    count: &dyn Fn(&str) -> usize,
) -> Result<Plan, TooLong> {
    let tokens = count(&doc.text);
    if tokens + reserve_tokens <= context_tokens {
        return Ok(Plan { tokens, mode: Mode::Whole });
    }
    let chunks = cut(doc, context_tokens / 2, count);
    let levels = merge_groups(chunks.len(), context_tokens, reserve_tokens).len();
    if levels > MAX_LEVELS {
        return Err(TooLong { name: doc.name.clone(), tokens, levels });
    }
    Ok(Plan { tokens, mode: Mode::Hierarchical { chunks, levels: levels.max(1) } })
}

/// The merge groups each level takes at most, from the first, for `notes` chunk notes: as many
/// notes as fit a prompt at [`SUMMARY_WITH_EVIDENCE_TOKENS`] each (two at least) make a group.
pub fn merge_groups(notes: usize, context_tokens: usize, reserve_tokens: usize) -> Vec<usize> {
    let per_merge = (context_tokens.saturating_sub(reserve_tokens) / SUMMARY_WITH_EVIDENCE_TOKENS).max(2);
    let mut groups = Vec::new();
    let mut left = notes;
    while left > 1 {
        left = left.div_ceil(per_merge);
        groups.push(left);
    }
    groups
}

/// The text cut into chunks of at most `budget` tokens: whole paragraphs (a blank line ends
/// one), a new chunk at each part (page or section) once the current one is half full, and a
/// paragraph longer than the budget split at line, then word, boundaries.
pub fn cut(doc: &Document, budget: usize, count: &dyn Fn(&str) -> usize) -> Vec<Range<usize>> {
    let starts: Vec<usize> = doc.parts.iter().map(|p| p.bytes.start).collect();
    let mut chunks = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (piece, tokens) in pieces(&doc.text, budget, count) {
        let section_starts = starts.binary_search(&piece.start).is_ok();
        if piece.start > start && (used + tokens > budget || (section_starts && 2 * used >= budget)) {
            chunks.push(start..piece.start);
            (start, used) = (piece.start, 0);
        }
        used += tokens;
    }
    if start < doc.text.len() {
        chunks.push(start..doc.text.len());
    }
    chunks
}

/// Paragraphs (with the blank lines after them), each split further if over `budget` tokens,
/// with their tokens (counted once: on a remote engine each count is a request).
fn pieces(text: &str, budget: usize, count: &dyn Fn(&str) -> usize) -> Vec<(Range<usize>, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < text.len() {
        let end = text[at..].find("\n\n").map_or(text.len(), |i| {
            let blank = text[at + i..].len() - text[at + i..].trim_start_matches('\n').len();
            at + i + blank
        });
        split_to_fit(text, at..end, budget, count, &mut out);
        at = end;
    }
    out
}

fn split_to_fit(
    text: &str,
    range: Range<usize>,
    budget: usize,
    count: &dyn Fn(&str) -> usize,
    out: &mut Vec<(Range<usize>, usize)>,
) {
    let tokens = count(&text[range.clone()]);
    if tokens <= budget {
        out.push((range, tokens));
        return;
    }
    let part = &text[range.clone()];
    // At the line (else the space) nearest the middle.
    let middle = part.floor_char_boundary(part.len() / 2);
    let cut = [
        part[..middle].rfind('\n'),
        part[middle..].find('\n').map(|i| middle + i),
        part[..middle].rfind(' '),
        part[middle..].find(' ').map(|i| middle + i),
    ]
    .into_iter()
    .flatten()
    .find(|&i| i > 0 && i + 1 < part.len())
    .map_or(middle.max(part.ceil_char_boundary(1)), |i| i + 1);
    split_to_fit(text, range.start..range.start + cut, budget, count, out);
    split_to_fit(text, range.start + cut..range.end, budget, count, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::{Format, Locator, Part};

    /// One token per word.
    fn words(s: &str) -> usize {
        s.split_whitespace().count()
    }

    fn doc(text: &str, parts: Vec<Part>) -> Document {
        Document { name: "d.txt".into(), format: Format::Text, text: text.into(), parts }
    }

    #[test]
    fn chunks_are_whole_paragraphs_within_budget_and_cover_the_text() {
        let text: String = (0..40).map(|i| format!("{}\n\n", vec![format!("p{i}"); 1 + i % 7].join(" "))).collect();
        let d = doc(&text, Vec::new());
        let chunks = cut(&d, 20, &words);
        assert_eq!(chunks.first().unwrap().start, 0);
        assert_eq!(chunks.last().unwrap().end, text.len());
        for pair in chunks.windows(2) {
            assert_eq!(pair[0].end, pair[1].start, "contiguous");
        }
        for c in &chunks {
            assert!(words(&text[c.clone()]) <= 20, "{:?}", &text[c.clone()]);
            assert!(text[..c.end].ends_with("\n\n"), "ends at a paragraph");
        }
    }

    #[test]
    fn each_paragraph_is_counted_once() {
        let text = "one two three\n\n".repeat(10);
        let calls = std::cell::Cell::new(0);
        let counted = |s: &str| {
            calls.set(calls.get() + 1);
            words(s)
        };
        assert_eq!(cut(&doc(&text, vec![]), 12, &counted).len(), 3, "four paragraphs of three words a chunk");
        assert_eq!(calls.get(), 10, "a count is a request on a remote engine");
    }

    #[test]
    fn a_section_start_begins_a_chunk_once_it_is_half_full_and_long_paragraphs_split() {
        let text = "a b c d e f\n\ng h i j k l\n\nm n o\n\n";
        let section = text.find("g h").unwrap();
        let d = doc(text, vec![Part { locator: Locator::Heading("G".into()), bytes: section..text.len() }]);
        assert_eq!(cut(&d, 10, &words), vec![0..section, section..text.len()]);
        let long = doc(&"word ".repeat(50), Vec::new());
        let chunks = cut(&long, 8, &words);
        assert!(chunks.iter().all(|c| words(&long.text[c.clone()]) <= 8) && chunks.len() >= 7, "{chunks:?}");
    }

    #[test]
    fn whole_when_it_fits_else_levels_of_merges_and_never_too_many() {
        let small = doc(&"word ".repeat(100), Vec::new());
        assert_eq!(plan(&small, 1000, 200, &words).unwrap().mode, Mode::Whole);
        let big = doc(&"word word word word word\n\n".repeat(2000), Vec::new());
        let Mode::Hierarchical { chunks, levels } = plan(&big, 8192, 512, &words).unwrap().mode else {
            panic!("hierarchical")
        };
        assert_eq!((chunks.len(), levels), (3, 1));
        // A 4,096-token context: chunks of 2,048 tokens, merges of 8 summaries.
        let huge = doc(&"word word word word word\n\n".repeat(40_000), Vec::new());
        let plan2 = plan(&huge, 4096, 512, &words).unwrap();
        assert!(matches!(plan2.mode, Mode::Hierarchical { levels: 3, .. }), "{:?}", plan2.tokens);
        let err = plan(&huge, 1024, 512, &words).unwrap_err();
        assert!(err.levels > MAX_LEVELS && err.to_string().contains("levels of merges"), "{err}");
    }
}
