//! Prompts about documents. The documents come first, before the task or the question, so that
//! every prompt on a document starts with the same tokens: the summary's prefill is the
//! question's too (kept on disk by [`crate::kv_cache`]). A document longer than the context is
//! asked about through its chunk that best matches the question — the same chunks the summary
//! read, so that chunk's K/V is kept as well. The match is lexical: the question's content
//! words weighted by how few chunks hold them (cheap, and it needs no prefill of the others).

use crate::chunks::{plan, Mode};
use crate::ingest::Document;
use crate::sources::content_words;
use hillside_engine::{ChatMessage, Engine};
use std::collections::HashSet;
use std::ops::Range;

/// Cut between the documents and the rest of a prompt, found in the rendered template.
const CUT: &str = "\u{E000}hillside-cut\u{E000}";

/// A prompt whose first `prefix_tokens` hold the documents alone.
#[derive(Debug, Clone, PartialEq)]
pub struct DocumentPrompt {
    pub tokens: Vec<u32>,
    pub prefix_tokens: usize,
}

/// What part of a document a prompt holds.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Excerpt {
    /// Bytes of the document's text.
    pub bytes: Range<usize>,
    /// The chunk (from 1, of `chunks`) a question went to; `None` when it holds the whole text.
    pub chunk: Option<usize>,
    pub chunks: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error(transparent)]
    Engine(#[from] hillside_engine::Error),
    #[error("the conversation has no user message to ask about the documents")]
    NoQuestion,
    #[error("{0}")]
    TooLong(String),
}

/// `messages` with `documents` (name and text) at the start of the first user message,
/// tokenized for `engine`.
pub fn document_prompt(
    engine: &Engine,
    documents: &[(&str, &str)],
    messages: &[ChatMessage],
) -> Result<DocumentPrompt, PromptError> {
    let messages = with_documents(documents, messages, CUT)?;
    let rendered = engine.chat_text(&messages)?;
    let at = rendered
        .find(CUT)
        .ok_or_else(|| hillside_engine::Error::ChatTemplate("the template dropped part of a message".into()))?;
    let tokenizer = engine.tokenizer();
    let tokens = tokenizer.encode_prompt(&rendered.replacen(CUT, "", 1))?;
    // The tokens of the text before the cut, as far as the whole prompt has them too (the
    // last one may merge with what follows).
    let prefix = tokenizer.encode_prompt(&rendered[..at])?;
    let prefix_tokens = prefix.iter().zip(&tokens).take_while(|(a, b)| a == b).count();
    Ok(DocumentPrompt { tokens, prefix_tokens })
}

/// `messages` with `documents` (name and text) at the start of the first user message, for
/// an engine that applies its own chat template.
pub fn document_messages(
    documents: &[(&str, &str)],
    messages: &[ChatMessage],
) -> Result<Vec<ChatMessage>, PromptError> {
    with_documents(documents, messages, "")
}

/// `messages` with the documents' block, then `cut`, at the start of the first user message.
fn with_documents(
    documents: &[(&str, &str)],
    messages: &[ChatMessage],
    cut: &str,
) -> Result<Vec<ChatMessage>, PromptError> {
    let first_user = messages.iter().position(|m| m.role == "user").ok_or(PromptError::NoQuestion)?;
    let mut messages = messages.to_vec();
    let block: String =
        documents.iter().map(|(name, text)| format!("Document \"{name}\":\n---\n{}\n---\n\n", text.trim())).collect();
    messages[first_user].content = format!("{block}{cut}{}", messages[first_user].content);
    Ok(messages)
}

/// The part of `doc` a prompt of `context_tokens` (keeping `reserve_tokens` for the rest) can
/// hold: the whole text, or the chunk that best matches `question`.
pub fn excerpt(
    doc: &Document,
    question: &str,
    context_tokens: usize,
    reserve_tokens: usize,
    count: &dyn Fn(&str) -> usize,
) -> Result<Excerpt, PromptError> {
    let planned = plan(doc, context_tokens, reserve_tokens, count).map_err(|e| PromptError::TooLong(e.to_string()))?;
    let Mode::Hierarchical { chunks, .. } = planned.mode else {
        return Ok(Excerpt { bytes: 0..doc.text.len(), chunk: None, chunks: 1 });
    };
    let best = best_chunk(&doc.text, &chunks, question);
    Ok(Excerpt { bytes: chunks[best].clone(), chunk: Some(best + 1), chunks: chunks.len() })
}

/// The chunk holding the most of the question's content words, each weighted by how few
/// chunks hold it (inverse document frequency); the first on a tie.
pub fn best_chunk(text: &str, chunks: &[Range<usize>], question: &str) -> usize {
    let words: HashSet<String> = content_words(question).collect();
    let held: Vec<HashSet<String>> =
        chunks.iter().map(|c| content_words(&text[c.clone()]).filter(|w| words.contains(w)).collect()).collect();
    let n = chunks.len() as f64;
    let weight = |w: &String| (n / held.iter().filter(|h| h.contains(w)).count().max(1) as f64).ln();
    let scores: Vec<f64> = held.iter().map(|h| h.iter().map(weight).sum()).collect();
    (0..chunks.len()).fold(0, |best, i| if scores[i] > scores[best] { i } else { best })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_question_goes_to_the_chunk_that_holds_its_rarest_words() {
        let text = "The castle stood on the hill. Rain fell.\n\nThe garden had roses and a fountain. Rain fell.\n\nThe ship left the harbour at dawn. Rain fell.\n\n";
        let chunks: Vec<Range<usize>> = {
            let a = text.find("The garden").unwrap();
            let b = text.find("The ship").unwrap();
            vec![0..a, a..b, b..text.len()]
        };
        assert_eq!(best_chunk(text, &chunks, "When did the ship leave the harbour?"), 2);
        assert_eq!(
            best_chunk(text, &chunks, "What grew in the garden, and did rain fall there?"),
            1,
            "rain is everywhere: it weighs nothing"
        );
        assert_eq!(best_chunk(text, &chunks, "Tell me about it."), 0, "no words to go on: the first");
    }
}
