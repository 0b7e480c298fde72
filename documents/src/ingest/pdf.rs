//! PDF, page by page (pdf_oxide), each page a part. A page whose text the library cannot get
//! out (it panics on some fonts) is empty, not the end of the document; a document with almost
//! no readable text is a scan, and says so.

use super::{Format, IngestError, Locator, Part};
use pdf_oxide::document::PdfDocument;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Readable characters a page must average for the document to count as having a text layer.
const MIN_CHARS_PER_PAGE: usize = 16;

pub fn read(name: &str, bytes: &[u8]) -> Result<(Format, String, Vec<Part>), IngestError> {
    let damaged = |reason: String| IngestError::Damaged { name: name.into(), reason };
    let doc = guarded(|| PdfDocument::from_bytes(bytes.to_vec()))
        .map_err(damaged)?
        .map_err(|e| classify(name, e.to_string()))?;
    // An encrypted PDF with an empty user password opens for anyone; one with a password does not.
    if doc.is_encrypted() && !doc.authenticate(b"").unwrap_or(false) {
        return Err(IngestError::Encrypted { name: name.into() });
    }
    let pages = doc.page_count().map_err(|e| classify(name, e.to_string()))?;
    let (mut text, mut parts, mut readable) = (String::new(), Vec::new(), 0);
    for page in 0..pages {
        let page_text = match guarded(|| doc.extract_text(page)) {
            Ok(Ok(t)) => t,
            Ok(Err(e)) if is_encryption(&e.to_string()) => return Err(IngestError::Encrypted { name: name.into() }),
            Ok(Err(e)) => {
                tracing::warn!(name, page = page + 1, error = %e, "a PDF page's text could not be read");
                String::new()
            }
            Err(panic) => {
                tracing::warn!(name, page = page + 1, panic, "the PDF reader failed on a page");
                String::new()
            }
        };
        readable += page_text.chars().filter(|c| c.is_alphanumeric()).count();
        let start = text.len();
        text.push_str(page_text.trim_end());
        text.push_str("\n\n");
        parts.push(Part { locator: Locator::Page(page as u32 + 1), bytes: start..text.len() });
    }
    if pages == 0 {
        return Err(damaged("it has no pages".into()));
    }
    if readable < MIN_CHARS_PER_PAGE * pages {
        return Err(IngestError::Scanned { name: name.into(), pages, chars: readable });
    }
    Ok((Format::Pdf, text, parts))
}

fn guarded<T>(work: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(work)).map_err(|p| {
        p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "a panic".into())
    })
}

fn is_encryption(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("encrypt") || m.contains("password")
}

fn classify(name: &str, message: String) -> IngestError {
    if is_encryption(&message) {
        IngestError::Encrypted { name: name.into() }
    } else {
        IngestError::Damaged { name: name.into(), reason: message }
    }
}
