//! A chat completion's server-sent events, read one bounded line at a time: a remote that
//! streams a line without end, or anything but the chunks OpenAI defines, gets a clear error.

use serde::Deserialize;
use std::io::BufRead;

/// The longest event line taken (a chunk carries a few tokens).
const MAX_LINE_BYTES: u64 = 1 << 20;

/// What one `data:` line says.
#[derive(Debug, PartialEq)]
pub enum Chunk {
    Text(String),
    /// The model's reasoning, apart from its answer (`reasoning_content`, as llama.cpp and vLLM
    /// send it).
    Reasoning(String),
    /// The choice ended (`stop` or `length`).
    Finished(String),
    Usage(Usage),
    /// Nothing for the reader (a role-only delta, a keep-alive).
    Nothing,
    Done,
}

/// Token counts as the remote reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: usize,
    #[serde(default)]
    pub completion_tokens: usize,
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct PromptDetails {
    #[serde(default)]
    pub cached_tokens: Option<usize>,
}

impl Usage {
    /// Prompt tokens the remote had cached, where it says.
    pub fn cached_tokens(&self) -> Option<usize> {
        self.prompt_tokens_details.as_ref().and_then(|d| d.cached_tokens)
    }
}

#[derive(Deserialize)]
struct Payload {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Choice {
    /// A chat completion's piece.
    #[serde(default)]
    delta: Option<Delta>,
    /// A text completion's piece.
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
}

/// The next meaningful line's chunks (a payload may end a choice and carry text at once);
/// `Ok(None)` at the end of the body. `Err` holds what was wrong, for the caller's error.
pub fn next(reader: &mut impl BufRead) -> Result<Option<Vec<Chunk>>, String> {
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = std::io::Read::take(&mut *reader, MAX_LINE_BYTES + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("the stream broke: {e}"))?;
        if read == 0 {
            return Ok(None);
        }
        if line.len() as u64 > MAX_LINE_BYTES {
            return Err(format!("an event line longer than {MAX_LINE_BYTES} bytes"));
        }
        let text = std::str::from_utf8(&line).map_err(|_| "an event line that is not UTF-8".to_string())?.trim();
        // Blank lines end events; comments and other fields carry nothing for us.
        let Some(data) = text.strip_prefix("data:") else { continue };
        return parse(data.trim()).map(Some);
    }
}

fn parse(data: &str) -> Result<Vec<Chunk>, String> {
    if data == "[DONE]" {
        return Ok(vec![Chunk::Done]);
    }
    let payload: Payload = serde_json::from_str(data)
        .map_err(|e| format!("an event that is not a chat completion chunk ({e}): {}", excerpt(data)))?;
    if let Some(error) = payload.error {
        return Err(format!("the engine failed mid-reply: {}", excerpt(&error.to_string())));
    }
    let mut chunks = Vec::new();
    for choice in payload.choices {
        let (content, reasoning) = choice.delta.map_or((None, None), |d| (d.content, d.reasoning_content));
        chunks.extend(reasoning.filter(|t| !t.is_empty()).map(Chunk::Reasoning));
        if let Some(text) = content.or(choice.text).filter(|t| !t.is_empty()) {
            chunks.push(Chunk::Text(text));
        }
        if let Some(reason) = choice.finish_reason {
            chunks.push(Chunk::Finished(reason));
        }
    }
    chunks.extend(payload.usage.map(Chunk::Usage));
    if chunks.is_empty() {
        chunks.push(Chunk::Nothing);
    }
    Ok(chunks)
}

/// The start of a remote's text, for an error message.
pub fn excerpt(text: &str) -> String {
    let cut = text.floor_char_boundary(200.min(text.len()));
    format!("{}{}", &text[..cut], if cut < text.len() { "…" } else { "" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_come_out_of_the_lines_that_carry_them() {
        let body = ": keep-alive\n\ndata: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n\
                    data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n";
        let mut reader = body.as_bytes();
        let mut got = Vec::new();
        while let Some(chunks) = next(&mut reader).unwrap() {
            got.extend(chunks);
        }
        let usage = Usage {
            prompt_tokens: 9,
            completion_tokens: 1,
            prompt_tokens_details: Some(PromptDetails { cached_tokens: Some(4) }),
        };
        assert_eq!(
            got,
            [
                Chunk::Nothing,
                Chunk::Text("Hi".into()),
                Chunk::Finished("stop".into()),
                Chunk::Usage(usage),
                Chunk::Done
            ]
        );
        let reasoning = "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"Hmm.\"}}]}\n";
        assert_eq!(next(&mut reasoning.as_bytes()).unwrap().unwrap(), [Chunk::Reasoning("Hmm.".into())]);
        let text_completion = "data: {\"choices\":[{\"text\":\" there\",\"finish_reason\":\"length\"}]}\n";
        assert_eq!(
            next(&mut text_completion.as_bytes()).unwrap().unwrap(),
            [Chunk::Text(" there".into()), Chunk::Finished("length".into())]
        );
    }

    #[test]
    fn garbage_an_error_event_and_an_endless_line_are_errors() {
        assert!(next(&mut "data: <html>oops</html>\n".as_bytes()).unwrap_err().contains("<html>oops"));
        assert!(next(&mut "data: {\"error\":{\"message\":\"out of memory\"}}\n".as_bytes())
            .unwrap_err()
            .contains("out of memory"));
        let endless = format!("data: {}", "x".repeat(MAX_LINE_BYTES as usize + 10));
        assert!(next(&mut endless.as_bytes()).unwrap_err().contains("longer than"));
    }
}
