//! PDF, page by page (pdf_oxide), each page a part. A page whose text the library cannot get
//! out (it panics on some fonts) is read by poppler's `pdftotext` where it is installed, else
//! left empty, not the end of the document; a document with almost no readable text is a scan,
//! and says so.

use super::{size, Bound, Format, IngestError, Limits, Locator, Part, Poppler};
use pdf_oxide::document::PdfDocument;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Readable characters a page must average for the document to count as having a text layer.
const MIN_CHARS_PER_PAGE: usize = 16;

pub fn read(
    name: &str,
    bytes: &[u8],
    limits: &Limits,
    poppler: Poppler,
) -> Result<(Format, String, Vec<Part>), IngestError> {
    // pdftotext's text is cut just past the limit, which the caller's check then refuses.
    combine(name, builtin_pages(name, bytes, limits), || poppler(bytes, limits.max_text_bytes + 1))
}

/// The document from the built-in reader's pages, with poppler's (`fallback`, asked only when
/// needed) where the built-in reader failed on the file or on pages, or found almost no text.
/// An encrypted file, or one over a limit, stays refused.
fn combine(
    name: &str,
    builtin: Result<Vec<Option<String>>, IngestError>,
    fallback: impl FnOnce() -> Option<Vec<String>>,
) -> Result<(Format, String, Vec<Part>), IngestError> {
    if let Ok(pages) = &builtin {
        if pages.iter().all(Option::is_some) && readable(pages.iter().flatten()) >= MIN_CHARS_PER_PAGE * pages.len() {
            return assemble(name, pages.iter().map(|p| p.clone().unwrap_or_default()).collect());
        }
    }
    let poppler = match &builtin {
        Err(IngestError::Encrypted { .. } | IngestError::OverLimit { .. }) => None,
        _ => fallback(),
    };
    match (builtin, poppler) {
        (Ok(pages), Some(other)) if other.len() == pages.len() => {
            let merged: Vec<String> = pages
                .into_iter()
                .zip(other)
                .map(|(ours, theirs)| ours.filter(|t| !t.trim().is_empty()).unwrap_or(theirs))
                .collect();
            assemble(name, merged)
        }
        (Ok(pages), _) => assemble(name, pages.into_iter().map(Option::unwrap_or_default).collect()),
        (Err(e @ IngestError::Damaged { .. }), Some(other)) => {
            tracing::info!(name, error = %e, "read with pdftotext instead");
            assemble(name, other)
        }
        (Err(e), _) => Err(e),
    }
}

/// Each page's text by the built-in reader; `None` for a page it failed on.
fn builtin_pages(name: &str, bytes: &[u8], limits: &Limits) -> Result<Vec<Option<String>>, IngestError> {
    let damaged = |reason: String| IngestError::Damaged { name: name.into(), reason };
    let doc = guarded(|| PdfDocument::from_bytes(bytes.to_vec()))
        .map_err(damaged)?
        .map_err(|e| classify(name, e.to_string()))?;
    // An encrypted PDF with an empty user password opens for anyone; one with a password does not.
    if doc.is_encrypted() && !doc.authenticate(b"").unwrap_or(false) {
        return Err(IngestError::Encrypted { name: name.into() });
    }
    let pages = doc.page_count().map_err(|e| classify(name, e.to_string()))?;
    if pages == 0 {
        return Err(damaged("it has no pages".into()));
    }
    let over = |bound, what| IngestError::OverLimit { name: name.into(), bound, what };
    if pages > limits.max_pdf_pages {
        return Err(over(Bound::PdfPages, format!("it has {pages} pages, over the limit of {}", limits.max_pdf_pages)));
    }
    let mut texts = Vec::with_capacity(pages);
    let mut text_bytes = 0;
    for page in 0..pages {
        texts.push(match guarded(|| doc.extract_text(page)) {
            Ok(Ok(t)) => {
                text_bytes += t.len();
                if text_bytes > limits.max_text_bytes {
                    return Err(over(
                        Bound::TextBytes,
                        format!(
                            "its text is over the limit of {} (at page {})",
                            size(limits.max_text_bytes as u64),
                            page + 1
                        ),
                    ));
                }
                Some(t)
            }
            Ok(Err(e)) if is_encryption(&e.to_string()) => return Err(IngestError::Encrypted { name: name.into() }),
            Ok(Err(e)) => {
                tracing::warn!(name, page = page + 1, error = %e, "a PDF page's text could not be read");
                None
            }
            Err(panic) => {
                tracing::warn!(name, page = page + 1, panic, "the PDF reader failed on a page");
                None
            }
        });
    }
    Ok(texts)
}

fn readable<'a>(pages: impl Iterator<Item = &'a String>) -> usize {
    pages.map(|p| p.chars().filter(|c| c.is_alphanumeric()).count()).sum()
}

/// The document from its pages' texts, each page a part; a scan if they hold almost no text.
fn assemble(name: &str, pages: Vec<String>) -> Result<(Format, String, Vec<Part>), IngestError> {
    let chars = readable(pages.iter());
    if pages.is_empty() || chars < MIN_CHARS_PER_PAGE * pages.len() {
        return Err(IngestError::Scanned { name: name.into(), pages: pages.len(), chars });
    }
    let (mut text, mut parts) = (String::new(), Vec::with_capacity(pages.len()));
    for (i, page) in pages.iter().enumerate() {
        let start = text.len();
        text.push_str(page.trim_end());
        text.push_str("\n\n");
        parts.push(Part { locator: Locator::Page(i as u32 + 1), bytes: start..text.len() });
    }
    Ok((Format::Pdf, text, parts))
}

fn guarded<T>(work: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(work)).map_err(|p| {
        p.downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-page PDF showing `lines` (Helvetica), with a correct cross-reference table.
    fn one_page(lines: &[&str]) -> Vec<u8> {
        let content: String = format!(
            "BT /F1 12 Tf 72 720 Td 14 TL {} ET",
            lines.iter().map(|l| format!("({l}) Tj T* ")).collect::<String>()
        );
        let objects = [
            "<< /Type /Catalog /Pages 2 0 R >>".to_string(),
            "<< /Type /Pages /Kids [4 0 R] /Count 1 >>".into(),
            "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".into(),
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents 5 0 R >>".into(),
            format!("<< /Length {} >>\nstream\n{content}\nendstream", content.len()),
        ];
        let mut out = b"%PDF-1.4\n".to_vec();
        let mut offsets = Vec::new();
        for (i, body) in objects.iter().enumerate() {
            offsets.push(out.len());
            out.extend_from_slice(format!("{} 0 obj\n{body}\nendobj\n", i + 1).as_bytes());
        }
        let xref = out.len();
        out.extend_from_slice(
            format!(
                "xref\n0 6\n0000000000 65535 f \n{}trailer\n<< /Size 6 /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
                offsets.iter().map(|o| format!("{o:010} 00000 n \n")).collect::<String>()
            )
            .as_bytes(),
        );
        out
    }

    /// The built-in reader's failures are injected; pdftotext (which `make test` installs) is real.
    #[test]
    fn pdftotext_reads_what_the_built_in_reader_could_not() {
        let bytes = one_page(&["Minutes of the harbour board meeting,", "held on the first of May."]);
        let poppler = || {
            let pages = super::super::pdftotext::pages(&bytes, 1 << 20, super::super::pdftotext::TIME_LIMIT);
            assert!(pages.is_some(), "pdftotext is installed and reads the file");
            pages
        };
        let damaged = IngestError::Damaged { name: "minutes.pdf".into(), reason: "a broken object stream".into() };
        let (_, text, parts) = combine("minutes.pdf", Err(damaged), poppler).unwrap();
        assert!(text.contains("harbour board meeting") && text.contains("first of May"), "{text:?}");
        assert_eq!(parts[0].locator, Locator::Page(1));
        let (_, text, _) = combine("minutes.pdf", Ok(vec![None]), poppler).unwrap();
        assert!(text.contains("harbour board"), "a page the built-in reader failed on: {text:?}");
        let encrypted =
            combine("minutes.pdf", Err(IngestError::Encrypted { name: "minutes.pdf".into() }), || panic!("not asked"))
                .unwrap_err();
        assert!(matches!(encrypted, IngestError::Encrypted { .. }));
        // Without pdftotext the failure stands, as it says.
        let scanned = combine("minutes.pdf", Ok(vec![None]), || None).unwrap_err();
        assert!(matches!(scanned, IngestError::Scanned { pages: 1, chars: 0, .. }), "{scanned}");
    }
}
