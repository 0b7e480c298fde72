//! The ZIP-based formats: DOCX (`word/document.xml`: paragraphs, with Word's heading styles
//! as parts) and EPUB (`META-INF/container.xml` → the OPF package → its spine's XHTML files, in
//! reading order).
//!
//! A ZIP's sizes are the file's word, not the truth, and deflate inflates a thousandfold: every
//! entry is read through a budget of [`Limits::max_unpacked_bytes`] for the whole archive, and
//! XML nests no deeper than [`Limits::max_nesting_depth`].

use super::{html, size, text, Bound, Format, IngestError, Limits, Locator, Part};
use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;
use std::io::{Cursor, Read};
use zip::ZipArchive;

type Archive<'a> = ZipArchive<Cursor<&'a [u8]>>;

/// Why an archive could not be read.
enum Failure {
    Damaged(String),
    Over(Bound, String),
}

impl From<String> for Failure {
    fn from(reason: String) -> Self {
        Self::Damaged(reason)
    }
}

/// An archive being read, with what is left of its budget.
struct Unpacking<'a> {
    zip: Archive<'a>,
    limits: &'a Limits,
    unpacked_bytes: u64,
}

pub fn read(name: &str, bytes: &[u8], limits: &Limits) -> Result<(Format, String, Vec<Part>), IngestError> {
    let failed = |failure| match failure {
        Failure::Damaged(reason) => IngestError::Damaged { name: name.into(), reason },
        Failure::Over(bound, what) => IngestError::OverLimit { name: name.into(), bound, what },
    };
    let zip = ZipArchive::new(Cursor::new(bytes))
        .map_err(|e| failed(Failure::Damaged(format!("the archive cannot be opened ({e})"))))?;
    if zip.len() > limits.max_archive_entries {
        return Err(failed(Failure::Over(
            Bound::ArchiveEntries,
            format!("it holds {} files, over the limit of {}", zip.len(), limits.max_archive_entries),
        )));
    }
    let mut archive = Unpacking { zip, limits, unpacked_bytes: 0 };
    if archive.zip.index_for_name("word/document.xml").is_some() {
        let xml = archive.entry("word/document.xml").map_err(failed)?;
        let (text, parts) = docx_text(&xml, limits.max_nesting_depth).map_err(failed)?;
        Ok((Format::Docx, text, parts))
    } else if archive.zip.index_for_name("META-INF/container.xml").is_some() {
        let (text, parts) = epub_text(&mut archive).map_err(failed)?;
        Ok((Format::Epub, text, parts))
    } else {
        Err(IngestError::Unsupported { name: name.into(), what: "a ZIP archive that is neither DOCX nor EPUB".into() })
    }
}

impl Unpacking<'_> {
    /// An entry's bytes as UTF-8 text, counted against the archive's budget; a truncated or
    /// corrupt entry is an error naming it.
    /// What may still be unpacked.
    fn budget(&self) -> u64 {
        self.limits.max_unpacked_bytes.saturating_sub(self.unpacked_bytes)
    }

    fn entry(&mut self, path: &str) -> Result<String, Failure> {
        let budget = self.budget();
        let over = |path: &str| {
            Failure::Over(
                Bound::UnpackedBytes,
                format!("it unpacks to more than {} (reading {path})", size(self.limits.max_unpacked_bytes)),
            )
        };
        let file = self.zip.by_name(path).map_err(|e| format!("{path}: {e}"))?;
        if file.size() > budget {
            return Err(over(path));
        }
        // Sized once from the (checked) declared size: growing by doubling would ask for twice
        // the budget at the end.
        let mut out = Vec::with_capacity(file.size() as usize + 1);
        file.take(budget + 1).read_to_end(&mut out).map_err(|e| format!("{path} cannot be read ({e})"))?;
        if out.len() as u64 > budget {
            return Err(over(path));
        }
        self.unpacked_bytes += out.len() as u64;
        String::from_utf8(out).map_err(|e| Failure::Damaged(format!("{path} is not UTF-8 ({e})")))
    }
}

/// Counts how deep an XML document's elements nest, refusing past `max`.
struct Depth {
    now: usize,
    max: usize,
}

impl Depth {
    fn new(max: usize) -> Self {
        Self { now: 0, max }
    }

    fn enter(&mut self, file: &str) -> Result<(), Failure> {
        self.now += 1;
        if self.now > self.max {
            return Err(Failure::Over(
                Bound::NestingDepth,
                format!("{file} nests elements more than {} deep", self.max),
            ));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.now = self.now.saturating_sub(1);
    }
}

/// The value of the attribute whose local name is `local` (`w:val`, `full-path`, …).
fn attribute(e: &BytesStart<'_>, local: &[u8]) -> Option<String> {
    e.attributes()
        .flatten()
        .find(|a| a.key.local_name().as_ref() == local)
        .and_then(|a| a.unescape_value().ok())
        .map(|v| v.into_owned())
}

fn docx_text(xml: &str, max_depth: usize) -> Result<(String, Vec<Part>), Failure> {
    let mut reader = Reader::from_str(xml);
    let (mut text, mut parts) = (String::new(), Vec::<Part>::new());
    let (mut paragraph, mut heading, mut in_text) = (String::new(), false, false);
    let mut depth = Depth::new(max_depth);
    loop {
        let event = reader.read_event().map_err(|e| format!("word/document.xml is not well-formed ({e})"))?;
        match &event {
            Event::Start(_) => depth.enter("word/document.xml")?,
            Event::End(_) => depth.leave(),
            _ => {}
        }
        match event {
            Event::Start(e) | Event::Empty(e) => match e.local_name().as_ref() {
                b"p" => (paragraph, heading) = (String::new(), false),
                b"pStyle" => heading = attribute(&e, b"val").is_some_and(|s| s.starts_with("Heading") || s == "Title"),
                b"t" => in_text = true,
                b"tab" => paragraph.push('\t'),
                b"br" | b"cr" => paragraph.push('\n'),
                _ => {}
            },
            Event::Text(t) if in_text => paragraph.push_str(&t.decode().map_err(|e| Failure::Damaged(e.to_string()))?),
            Event::GeneralRef(r) if in_text => {
                if let Some(c) = r.resolve_char_ref().ok().flatten() {
                    paragraph.push(c);
                } else {
                    paragraph.push_str(
                        quick_xml::escape::resolve_xml_entity(
                            &r.decode().map_err(|e| Failure::Damaged(e.to_string()))?,
                        )
                        .unwrap_or(""),
                    );
                }
            }
            Event::End(e) => match e.local_name().as_ref() {
                b"t" => in_text = false,
                b"p" => {
                    let line = paragraph.trim();
                    if heading && !line.is_empty() {
                        if let Some(last) = parts.last_mut() {
                            last.bytes.end = text.len();
                        }
                        parts.push(Part { locator: Locator::Heading(line.to_string()), bytes: text.len()..text.len() });
                    }
                    if !line.is_empty() {
                        text.push_str(line);
                        text.push_str("\n\n");
                    }
                }
                _ => {}
            },
            Event::Eof => break,
            _ => {}
        }
    }
    if let Some(last) = parts.last_mut() {
        last.bytes.end = text.len();
    }
    Ok((text, parts))
}

fn epub_text(archive: &mut Unpacking<'_>) -> Result<(String, Vec<Part>), Failure> {
    let max_depth = archive.limits.max_nesting_depth;
    let container = archive.entry("META-INF/container.xml")?;
    let opf_path = first_attribute(&container, b"rootfile", b"full-path", max_depth)?
        .ok_or("META-INF/container.xml names no package file".to_string())?;
    let opf = archive.entry(&opf_path)?;
    let base = opf_path.rsplit_once('/').map_or(String::new(), |(dir, _)| format!("{dir}/"));
    // The manifest's id → href, then the spine's idrefs in reading order.
    let (mut manifest, mut spine) = (Vec::new(), Vec::new());
    let mut reader = Reader::from_str(&opf);
    let mut depth = Depth::new(max_depth);
    loop {
        let event = reader.read_event().map_err(|e| format!("{opf_path} is not well-formed ({e})"))?;
        match &event {
            Event::Start(_) => depth.enter(&opf_path)?,
            Event::End(_) => depth.leave(),
            _ => {}
        }
        match event {
            Event::Start(e) | Event::Empty(e) => match e.local_name().as_ref() {
                b"item" => manifest.extend(attribute(&e, b"id").zip(attribute(&e, b"href"))),
                b"itemref" => spine.extend(attribute(&e, b"idref")),
                _ => {}
            },
            Event::Eof => break,
            _ => {}
        }
    }
    let chapters = spine
        .iter()
        .map(|idref| {
            let href = manifest
                .iter()
                .find(|(id, _)| id == idref)
                .map(|(_, href)| href)
                .ok_or_else(|| format!("the spine names {idref}, which the manifest lacks"))?;
            Ok(format!("{base}{}", percent_decode(href)))
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    // A spine may name one chapter many times: what it reads adds up before any is inflated.
    let mut declared_bytes = 0u64;
    for path in &chapters {
        declared_bytes =
            declared_bytes.saturating_add(archive.zip.by_name(path).map_err(|e| format!("{path}: {e}"))?.size());
    }
    if declared_bytes > archive.budget() {
        let what = format!(
            "the chapters its spine reads unpack to {}, over the limit of {}",
            size(declared_bytes),
            size(archive.limits.max_unpacked_bytes)
        );
        return Err(Failure::Over(Bound::UnpackedBytes, what));
    }
    let mut text = String::new();
    for path in &chapters {
        let chapter = html::to_text(&archive.entry(path)?, max_depth)
            .map_err(|what| Failure::Over(Bound::NestingDepth, format!("{path}: {what}")))?;
        text.push_str(chapter.trim());
        text.push_str("\n\n");
        if text.len() > archive.limits.max_text_bytes {
            return Err(Failure::Over(
                Bound::TextBytes,
                format!("its text is over the limit of {}", size(archive.limits.max_text_bytes as u64)),
            ));
        }
    }
    let parts = text::heading_parts(&text);
    Ok((text, parts))
}

/// The first `element`'s `name` attribute in `xml`.
fn first_attribute(xml: &str, element: &[u8], name: &[u8], max_depth: usize) -> Result<Option<String>, Failure> {
    let mut reader = Reader::from_str(xml);
    let mut depth = Depth::new(max_depth);
    loop {
        match reader.read_event().map_err(|e| format!("not well-formed XML ({e})"))? {
            Event::Start(e) | Event::Empty(e) if e.local_name().as_ref() == element => return Ok(attribute(&e, name)),
            Event::Start(_) => depth.enter("META-INF/container.xml")?,
            Event::End(_) => depth.leave(),
            Event::Eof => return Ok(None),
            _ => {}
        }
    }
}

/// `%20`-style escapes in an OPF href.
fn percent_decode(href: &str) -> String {
    let bytes = href.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
