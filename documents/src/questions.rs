//! Questions about documents: the prompt a chat's messages become when they are about documents
//! of the library (the documents first, so that their K/V, kept since the summary, is reused;
//! a document longer than the context through the chunk that best matches the question).

use crate::ingest::Document;
use crate::prompt::{excerpt, Excerpt, PromptError};
use crate::summarize::{Request, Runner, RESERVE_TOKENS};
use hillside_engine::ChatMessage;

/// A question's request and what of each document it holds.
pub struct Question {
    pub request: Request,
    pub excerpts: Vec<Excerpt>,
}

/// The request for `messages` about `documents` (library id and document, in order).
pub fn question(
    runner: &Runner<'_>,
    documents: &[(String, Document)],
    messages: &[ChatMessage],
) -> Result<Question, PromptError> {
    let asked = messages.iter().rev().find(|m| m.role == "user").ok_or(PromptError::NoQuestion)?;
    let count = |s: &str| runner.count_tokens(s);
    // The same plan as the summary's, so a long document's chunks are the ones whose K/V it kept.
    let excerpts: Vec<Excerpt> = documents
        .iter()
        .map(|(_, doc)| excerpt(doc, &asked.content, runner.context_tokens, RESERVE_TOKENS, &count))
        .collect::<Result<_, _>>()?;
    if documents.len() > 1 {
        let tokens: usize = documents.iter().map(|(_, d)| count(&d.text)).sum();
        if tokens + RESERVE_TOKENS > runner.context_tokens {
            return Err(PromptError::TooLong(format!(
                "these {} documents take {tokens} tokens together, more than a context of {} holds with room for the answer; ask about fewer at a time",
                documents.len(),
                runner.context_tokens
            )));
        }
    }
    let ids: Vec<String> = documents.iter().map(|(id, _)| id.clone()).collect();
    let texts: Vec<(&str, &str)> =
        documents.iter().zip(&excerpts).map(|((_, d), e)| (d.name.as_str(), &d.text[e.bytes.clone()])).collect();
    Ok(Question { request: runner.document_request(&ids, &texts, messages)?, excerpts })
}
