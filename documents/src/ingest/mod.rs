//! Reading a file into a [`Document`]: its text, as the model will read it, and where each page
//! (PDF) or section (a heading's span, elsewhere) lies in that text, so a passage can be cited.
//!
//! The format is found from the bytes (a file's name is only a hint for Markdown): plain text in
//! any encoding, Markdown, HTML, PDF, DOCX and EPUB. Anything else, and files that are empty,
//! too large, encrypted, damaged or scanned (no text layer), is an [`IngestError`] that says
//! which, and nothing is kept of it.

mod archive;
mod html;
pub mod isolated;
mod pdf;
mod pdftotext;
pub mod sandbox;
mod text;

use std::ops::Range;
use std::path::Path;

/// A document's formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Text,
    Markdown,
    Html,
    Pdf,
    Docx,
    Epub,
}

/// Where a part of a document is, as a reader would cite it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Locator {
    /// A PDF page, from 1.
    Page(u32),
    /// A section, by its heading.
    Heading(String),
}

/// One page or section: its locator and its bytes of [`Document::text`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Part {
    pub locator: Locator,
    pub bytes: Range<usize>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Document {
    /// The file's name, as the user gave it.
    pub name: String,
    pub format: Format,
    pub text: String,
    /// Pages or sections, in order, not overlapping; text before the first heading has none.
    pub parts: Vec<Part>,
}

impl Document {
    /// The page or section holding byte `at` of the text.
    pub fn locate(&self, at: usize) -> Option<&Locator> {
        self.parts.iter().find(|p| p.bytes.contains(&at)).map(|p| &p.locator)
    }
}

/// What a file may be, and what reading it may cost: every bound a hostile file could push
/// (a ZIP that inflates a thousandfold, markup nested a hundred thousand deep, a PDF of a
/// million empty pages) is one of these, and a file over one is refused naming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    pub max_file_bytes: u64,
    /// The text a document may hold once read.
    pub max_text_bytes: usize,
    /// What a DOCX or EPUB may inflate to, all entries read together.
    pub max_unpacked_bytes: u64,
    /// Entries a DOCX or EPUB may hold.
    pub max_archive_entries: usize,
    /// How deep elements may nest in HTML and XML (real pages stay under a hundred).
    pub max_nesting_depth: usize,
    pub max_pdf_pages: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_file_bytes: 256 << 20,
            max_text_bytes: 64 << 20,
            max_unpacked_bytes: 256 << 20,
            max_archive_entries: 10_000,
            max_nesting_depth: 512,
            max_pdf_pages: 10_000,
        }
    }
}

/// Which bound a document went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    TextBytes,
    UnpackedBytes,
    ArchiveEntries,
    NestingDepth,
    PdfPages,
    /// The reader's memory (an isolated read only).
    Memory,
    /// The reader's time (an isolated read only).
    Time,
}

impl Bound {
    /// The bound as an API's error names it (`param`).
    pub fn name(self) -> &'static str {
        match self {
            Self::TextBytes => "max_text_bytes",
            Self::UnpackedBytes => "max_unpacked_bytes",
            Self::ArchiveEntries => "max_archive_entries",
            Self::NestingDepth => "max_nesting_depth",
            Self::PdfPages => "max_pdf_pages",
            Self::Memory => "reader_memory",
            Self::Time => "reader_time",
        }
    }
}

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum IngestError {
    #[error("{name} is empty")]
    Empty { name: String },
    #[error("{name} is {size_mb:.1} MB, over the limit of {limit_mb:.1} MB for a document")]
    TooLarge { name: String, size_mb: f64, limit_mb: f64 },
    #[error(
        "{name} is not a document Hillside can read ({what}); it reads plain text, Markdown, HTML, PDF, DOCX and EPUB"
    )]
    Unsupported { name: String, what: String },
    #[error("{name} is encrypted: save a copy without a password and add that")]
    Encrypted { name: String },
    #[error(
        "{name} has no text layer ({pages} pages, {chars} readable characters): it looks scanned; run OCR on it first"
    )]
    Scanned { name: String, pages: usize, chars: usize },
    #[error("{name} is damaged: {reason}")]
    Damaged { name: String, reason: String },
    #[error("{name} has no text")]
    NoText { name: String },
    /// `what` says the bound's value and what went past it.
    #[error("{name} is over a limit on what a document may be: {what}")]
    OverLimit { name: String, bound: Bound, what: String },
    /// The isolated reader stopped without an answer (it crashed, or could not start).
    #[error("{name} could not be read: {why}")]
    ReaderFailed { name: String, why: String },
    /// Never crosses a process: the isolated reader has the bytes already.
    #[error("cannot read {name}: {source}")]
    #[serde(skip)]
    Io { name: String, source: std::io::Error },
}

/// Reads the file at `path` (named by its file name in messages).
pub fn read_file(path: &Path, limits: &Limits) -> Result<Document, IngestError> {
    let (name, bytes) = file_bytes(path, limits)?;
    read_bytes(&name, &bytes, limits)
}

/// The file's name and its bytes, its size checked before (and while) it is read.
pub fn file_bytes(path: &Path, limits: &Limits) -> Result<(String, Vec<u8>), IngestError> {
    use std::io::Read;
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let io = |source| IngestError::Io { name: name.clone(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    check_size(&name, size, limits)?;
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(limits.max_file_bytes + 1).read_to_end(&mut bytes).map_err(io)?;
    check_size(&name, bytes.len() as u64, limits)?;
    Ok((name, bytes))
}

/// Reads a document held in memory (an upload), named `name`.
pub fn read_bytes(name: &str, bytes: &[u8], limits: &Limits) -> Result<Document, IngestError> {
    read_bytes_with(name, bytes, limits, &|pdf, max_text_bytes| {
        pdftotext::pages(pdf, max_text_bytes, pdftotext::TIME_LIMIT)
    })
}

/// Poppler's pages of a PDF (at most so many bytes of text), or `None`: how a reader that may
/// not run programs itself has them run for it.
pub type Poppler<'a> = &'a dyn Fn(&[u8], usize) -> Option<Vec<String>>;

/// [`read_bytes`], with `poppler` asked for the pages of a PDF the built-in reader cannot read.
pub fn read_bytes_with(name: &str, bytes: &[u8], limits: &Limits, poppler: Poppler) -> Result<Document, IngestError> {
    check_size(name, bytes.len() as u64, limits)?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(IngestError::Empty { name: name.into() });
    }
    let over = |bound: Bound, what: String| IngestError::OverLimit { name: name.into(), bound, what };
    let (format, text, parts) = match sniff(name, bytes) {
        Sniffed::Pdf => pdf::read(name, bytes, limits, poppler)?,
        Sniffed::Zip => archive::read(name, bytes, limits)?,
        Sniffed::Text => {
            let text = text::decode(name, bytes)?;
            if html::looks_like_html(&text) {
                let text =
                    html::to_text(&text, limits.max_nesting_depth).map_err(|what| over(Bound::NestingDepth, what))?;
                let parts = text::heading_parts(&text);
                (Format::Html, text, parts)
            } else {
                let markdown = has_extension(name, &["md", "markdown"]) || text::looks_like_markdown(&text);
                let parts = if markdown { text::heading_parts(&text) } else { Vec::new() };
                (if markdown { Format::Markdown } else { Format::Text }, text, parts)
            }
        }
    };
    if text.len() > limits.max_text_bytes {
        return Err(over(
            Bound::TextBytes,
            format!(
                "its text is {}, over the limit of {}",
                size(text.len() as u64),
                size(limits.max_text_bytes as u64)
            ),
        ));
    }
    if text.trim().is_empty() {
        return Err(IngestError::NoText { name: name.into() });
    }
    Ok(Document { name: name.into(), format, text, parts })
}

/// A size as a message says it: "268.4 MB", "17.2 GB".
fn size(bytes: u64) -> String {
    let (value, unit) = match bytes {
        b if b >= 1_000_000_000_000 => (b as f64 / 1e12, "TB"),
        b if b >= 1_000_000_000 => (b as f64 / 1e9, "GB"),
        b => (b as f64 / 1e6, "MB"),
    };
    format!("{value:.1} {unit}")
}

/// Refuses an empty file, or one over [`Limits::max_file_bytes`].
fn check_size(name: &str, size: u64, limits: &Limits) -> Result<(), IngestError> {
    if size == 0 {
        return Err(IngestError::Empty { name: name.into() });
    }
    if size > limits.max_file_bytes {
        let mb = |b: u64| b as f64 / 1e6;
        return Err(IngestError::TooLarge {
            name: name.into(),
            size_mb: mb(size),
            limit_mb: mb(limits.max_file_bytes),
        });
    }
    Ok(())
}

enum Sniffed {
    Pdf,
    Zip,
    Text,
}

fn sniff(name: &str, bytes: &[u8]) -> Sniffed {
    // A PDF may have a few bytes of junk before its header.
    if bytes[..bytes.len().min(1024)].windows(5).any(|w| w == b"%PDF-") {
        Sniffed::Pdf
    } else if bytes.starts_with(b"PK\x03\x04") || has_extension(name, &["docx", "epub"]) {
        Sniffed::Zip
    } else {
        Sniffed::Text
    }
}

fn has_extension(name: &str, extensions: &[&str]) -> bool {
    let ext = Path::new(name).extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    ext.is_some_and(|e| extensions.contains(&e.as_str()))
}
