//! Where a point of a summary comes from: the passages of the document that hold the words it
//! is built from. Found by the words themselves, not by asking the model (a small model cites
//! badly): the point's content words are covered greedily by passages, each round taking the
//! passage that adds the most rare words (weighted by inverse passage frequency). A point
//! whose words the document does not hold gets no source rather than a wrong one.

use crate::ingest::{Document, Locator};
use std::collections::{HashMap, HashSet};
use std::ops::Range;

/// One point of a summary and the passages it comes from.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Point {
    pub text: String,
    pub sources: Vec<Source>,
}

/// A passage behind a point: its bytes of the document's text, its page or section, and the
/// point's words it holds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Source {
    pub bytes: Range<usize>,
    pub locator: Option<Locator>,
    pub words: Vec<String>,
}

/// Passages: paragraphs, or windows of sentences of about this many bytes in longer ones.
const PASSAGE_BYTES: usize = 600;

/// The document's passages and, per word, in how many of them it appears.
pub struct SourceIndex<'d> {
    doc: &'d Document,
    passages: Vec<(Range<usize>, HashSet<String>)>,
    passage_count: HashMap<String, usize>,
}

impl<'d> SourceIndex<'d> {
    pub fn new(doc: &'d Document) -> Self {
        let passages: Vec<(Range<usize>, HashSet<String>)> =
            passages(&doc.text).into_iter().map(|r| (r.clone(), content_words(&doc.text[r]).collect())).collect();
        let mut passage_count = HashMap::new();
        for (_, words) in &passages {
            for w in words {
                *passage_count.entry(w.clone()).or_insert(0) += 1;
            }
        }
        Self { doc, passages, passage_count }
    }

    /// A source's passage, at most about `max_bytes` of it, on one line.
    pub fn passage_text(&self, source: &Source, max_bytes: usize) -> String {
        let text = &self.doc.text[source.bytes.clone()];
        let cut = text.floor_char_boundary(max_bytes.min(text.len()));
        let mut out: String = text[..cut].split_whitespace().collect::<Vec<_>>().join(" ");
        if cut < text.len() {
            out.push('…');
        }
        out
    }

    /// Up to `max_sources` passages covering `point`'s content words, best first; none when
    /// together they hold fewer than half of its words (the document does not say it). A point of
    /// several sentences that so few passages cannot cover together (a small model sometimes
    /// writes a paragraph as one point) is traced sentence by sentence: each sentence the
    /// document holds brings its best passage, in the point's order.
    pub fn sources(&self, point: &str, max_sources: usize) -> Vec<Source> {
        let whole = self.cover(point, max_sources);
        let sentences = sentences(point);
        if !whole.is_empty() || sentences.len() < 2 {
            return whole;
        }
        let mut out: Vec<Source> = Vec::new();
        for sentence in sentences {
            if out.len() == max_sources {
                break;
            }
            let Some(found) = self.cover(sentence, 1).pop() else { continue };
            match out.iter_mut().find(|s| s.bytes == found.bytes) {
                Some(same) => {
                    same.words.extend(found.words);
                    same.words.sort();
                    same.words.dedup();
                }
                None => out.push(found),
            }
        }
        out
    }

    /// Up to `max_sources` passages that together hold at least half of `text`'s content words,
    /// each round taking the one that adds the most weight; none if they cannot.
    fn cover(&self, text: &str, max_sources: usize) -> Vec<Source> {
        let mut wanted: HashSet<String> = content_words(text).collect();
        let asked = wanted.len();
        let n = self.passages.len() as f64;
        let weight = |w: &str| (n / self.passage_count.get(w).copied().unwrap_or(1) as f64).ln() + 1.0;
        let mut out = Vec::new();
        while out.len() < max_sources && !wanted.is_empty() {
            let best = self
                .passages
                .iter()
                .map(|(range, words)| (range, words, words.intersection(&wanted).map(|w| weight(w)).sum::<f64>()))
                .filter(|(.., score)| *score > 0.0)
                .max_by(|a, b| a.2.total_cmp(&b.2).then_with(|| b.0.start.cmp(&a.0.start)));
            let Some((range, words, _)) = best else { break };
            let mut held: Vec<String> = words.intersection(&wanted).cloned().collect();
            // A passage that adds a single common word is noise, not a source.
            if held.len() < 2 && !out.is_empty() {
                break;
            }
            held.sort();
            wanted.retain(|w| !words.contains(w));
            out.push(Source { bytes: range.clone(), locator: self.doc.locate(range.start).cloned(), words: held });
        }
        if 2 * (asked - wanted.len()) < asked {
            return Vec::new();
        }
        out
    }
}

/// Lowercased words of three letters or more, not stop words, plural `s` dropped.
pub fn content_words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 3)
        .map(|w| w.to_lowercase())
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .map(|w| match w.strip_suffix('s') {
            Some(stem) if stem.len() >= 3 && !stem.ends_with('s') => stem.to_string(),
            _ => w,
        })
}

const STOP_WORDS: &[&str] = &[
    "the", "and", "for", "that", "this", "with", "are", "was", "were", "not", "but", "you", "your", "from", "which",
    "have", "has", "had", "its", "any", "all", "can", "may", "such", "they", "their", "them", "these", "those", "will",
    "would", "shall", "should", "there", "than", "then", "also", "into", "onto", "upon", "about", "what", "when",
    "who", "whom", "how", "each", "other", "more", "most", "some", "only", "own", "does", "did", "been", "being",
    "her", "his", "she", "him", "our", "out", "one", "document", "summary", "text",
];

/// The sentences of `text`, each with its closing mark.
fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, _) in text.match_indices(['.', '?', '!']) {
        if text[i + 1..].starts_with(' ') {
            out.push(text[start..=i].trim());
            start = i + 1;
        }
    }
    out.push(text[start..].trim());
    out.retain(|s| !s.is_empty());
    out
}

/// Paragraphs, with longer ones cut into windows of whole sentences.
fn passages(text: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    for para in text.split_inclusive("\n\n") {
        let range = at..at + para.len();
        at += para.len();
        if para.trim().is_empty() {
            continue;
        }
        let mut start = range.start;
        let mut last_end = start;
        for (i, _) in para.match_indices(". ") {
            let end = range.start + i + 2;
            if end - start > PASSAGE_BYTES && last_end > start {
                out.push(start..last_end);
                start = last_end;
            }
            last_end = end;
        }
        out.push(start..range.end);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::{Format, Part};

    #[test]
    fn a_point_is_traced_to_the_passages_holding_its_words() {
        let text = "Rents are paid monthly to the landlord.\n\nThe deposit equals two months of rent and is returned within thirty days.\n\n\
                    Pets need the landlord's written consent.\n\n";
        let pets = text.find("Pets").unwrap();
        let doc = Document {
            name: "lease.txt".into(),
            format: Format::Text,
            text: text.into(),
            parts: vec![Part { locator: Locator::Heading("Pets".into()), bytes: pets..text.len() }],
        };
        let index = SourceIndex::new(&doc);
        let sources = index.sources("The deposit, two months of rent, comes back within thirty days.", 3);
        assert_eq!(sources.len(), 1, "{sources:?}");
        assert!(text[sources[0].bytes.clone()].starts_with("The deposit equals"));
        assert_eq!(
            sources[0].words,
            ["day", "deposit", "month", "rent", "thirty", "two", "within"],
            "the point's words the passage holds"
        );
        let two = index.sources("Pets need written consent, and rents are paid monthly.", 3);
        assert_eq!(two.len(), 2, "{two:?}");
        assert_eq!(two.iter().find(|s| s.bytes.start == pets).unwrap().locator, Some(Locator::Heading("Pets".into())));
        assert!(
            index.sources("Quantum chromodynamics explains gluons.", 3).is_empty(),
            "no source rather than a wrong one"
        );
        assert!(
            index.sources("Quantum rent chromodynamics explains gluons.", 3).is_empty(),
            "one word of five is not a source"
        );
    }

    #[test]
    fn a_paragraph_written_as_one_point_is_traced_sentence_by_sentence() {
        let text = "Rents are paid monthly to the landlord.\n\nThe deposit equals two months of rent and is returned within thirty days.\n\n\
                    Pets need the landlord's written consent.\n\n";
        let doc = Document { name: "lease.txt".into(), format: Format::Text, text: text.into(), parts: Vec::new() };
        let index = SourceIndex::new(&doc);
        let point = "The deposit equals two months of rent. Quantum chromodynamics explains gluons, quarks and \
                     hadrons in colliders. Pets need written consent! Neutrinos oscillate between flavours across \
                     enormous distances.";
        let sources = index.sources(point, 3);
        let starts: Vec<&str> = sources.iter().map(|s| &text[s.bytes.start..s.bytes.start + 4]).collect();
        assert_eq!(starts, ["The ", "Pets"], "the sentences the lease holds, in the point's order: {sources:?}");
        assert_eq!(sources[1].words, ["consent", "need", "pet", "written"]);
        assert!(index.sources("Quantum chromodynamics explains gluons. Neutrinos oscillate.", 3).is_empty());
        assert_eq!(
            sentences("One. Two? Three! Version 1.5 is out."),
            ["One.", "Two?", "Three!", "Version 1.5 is out."]
        );
    }
}
