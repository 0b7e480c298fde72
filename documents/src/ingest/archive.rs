//! The ZIP-based formats: DOCX (`word/document.xml`: paragraphs, with Word's heading styles
//! as parts) and EPUB (`META-INF/container.xml` → the OPF package → its spine's XHTML files, in
//! reading order).

use super::{html, text, Format, IngestError, Locator, Part};
use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;
use std::io::{Cursor, Read};
use zip::ZipArchive;

type Archive<'a> = ZipArchive<Cursor<&'a [u8]>>;

pub fn read(name: &str, bytes: &[u8]) -> Result<(Format, String, Vec<Part>), IngestError> {
    let damaged = |reason: String| IngestError::Damaged { name: name.into(), reason };
    let mut zip = ZipArchive::new(Cursor::new(bytes)).map_err(|e| damaged(format!("the archive cannot be opened ({e})")))?;
    if zip.index_for_name("word/document.xml").is_some() {
        let xml = entry(&mut zip, "word/document.xml").map_err(damaged)?;
        let (text, parts) = docx_text(&xml).map_err(damaged)?;
        Ok((Format::Docx, text, parts))
    } else if zip.index_for_name("META-INF/container.xml").is_some() {
        let (text, parts) = epub_text(&mut zip).map_err(damaged)?;
        Ok((Format::Epub, text, parts))
    } else {
        Err(IngestError::Unsupported { name: name.into(), what: "a ZIP archive that is neither DOCX nor EPUB".into() })
    }
}

/// An entry's bytes as UTF-8 text; a truncated or corrupt entry is an error naming it.
fn entry(zip: &mut Archive<'_>, path: &str) -> Result<String, String> {
    let mut file = zip.by_name(path).map_err(|e| format!("{path}: {e}"))?;
    let mut out = String::new();
    file.read_to_string(&mut out).map_err(|e| format!("{path} cannot be read ({e})"))?;
    Ok(out)
}

/// The value of the attribute whose local name is `local` (`w:val`, `full-path`, …).
fn attribute(e: &BytesStart<'_>, local: &[u8]) -> Option<String> {
    e.attributes().flatten().find(|a| a.key.local_name().as_ref() == local).and_then(|a| a.unescape_value().ok()).map(|v| v.into_owned())
}

fn docx_text(xml: &str) -> Result<(String, Vec<Part>), String> {
    let mut reader = Reader::from_str(xml);
    let (mut text, mut parts) = (String::new(), Vec::<Part>::new());
    let (mut paragraph, mut heading, mut in_text) = (String::new(), false, false);
    loop {
        match reader.read_event().map_err(|e| format!("word/document.xml is not well-formed ({e})"))? {
            Event::Start(e) | Event::Empty(e) => match e.local_name().as_ref() {
                b"p" => (paragraph, heading) = (String::new(), false),
                b"pStyle" => heading = attribute(&e, b"val").is_some_and(|s| s.starts_with("Heading") || s == "Title"),
                b"t" => in_text = true,
                b"tab" => paragraph.push('\t'),
                b"br" | b"cr" => paragraph.push('\n'),
                _ => {}
            },
            Event::Text(t) if in_text => paragraph.push_str(&t.decode().map_err(|e| e.to_string())?),
            Event::GeneralRef(r) if in_text => {
                if let Some(c) = r.resolve_char_ref().ok().flatten() {
                    paragraph.push(c);
                } else {
                    paragraph.push_str(quick_xml::escape::resolve_xml_entity(&r.decode().map_err(|e| e.to_string())?).unwrap_or(""));
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

fn epub_text(zip: &mut Archive<'_>) -> Result<(String, Vec<Part>), String> {
    let container = entry(zip, "META-INF/container.xml")?;
    let opf_path = first_attribute(&container, b"rootfile", b"full-path")?.ok_or("META-INF/container.xml names no package file")?;
    let opf = entry(zip, &opf_path)?;
    let base = opf_path.rsplit_once('/').map_or(String::new(), |(dir, _)| format!("{dir}/"));
    // The manifest's id → href, then the spine's idrefs in reading order.
    let (mut manifest, mut spine) = (Vec::new(), Vec::new());
    let mut reader = Reader::from_str(&opf);
    loop {
        match reader.read_event().map_err(|e| format!("{opf_path} is not well-formed ({e})"))? {
            Event::Start(e) | Event::Empty(e) => match e.local_name().as_ref() {
                b"item" => manifest.extend(attribute(&e, b"id").zip(attribute(&e, b"href"))),
                b"itemref" => spine.extend(attribute(&e, b"idref")),
                _ => {}
            },
            Event::Eof => break,
            _ => {}
        }
    }
    let mut text = String::new();
    for idref in &spine {
        let href = manifest.iter().find(|(id, _)| id == idref).map(|(_, href)| href).ok_or_else(|| format!("the spine names {idref}, which the manifest lacks"))?;
        let chapter = html::to_text(&entry(zip, &format!("{base}{}", percent_decode(href)))?);
        text.push_str(chapter.trim());
        text.push_str("\n\n");
    }
    let parts = text::heading_parts(&text);
    Ok((text, parts))
}

/// The first `element`'s `name` attribute in `xml`.
fn first_attribute(xml: &str, element: &[u8], name: &[u8]) -> Result<Option<String>, String> {
    let mut reader = Reader::from_str(xml);
    loop {
        match reader.read_event().map_err(|e| format!("not well-formed XML ({e})"))? {
            Event::Start(e) | Event::Empty(e) if e.local_name().as_ref() == element => return Ok(attribute(&e, name)),
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
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
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
