//! Plain text in any encoding, and the headings of Markdown-shaped text.

use super::{IngestError, Locator, Part};

/// The bytes as text: UTF-8, UTF-16 or UTF-8 with a byte-order mark, else the encoding
/// chardetng guesses (windows-1252, Shift_JIS, …). Binary data is refused.
pub fn decode(name: &str, bytes: &[u8]) -> Result<String, IngestError> {
    if let Some((encoding, bom)) = encoding_rs::Encoding::for_bom(bytes) {
        let (text, _) = encoding.decode_without_bom_handling(&bytes[bom..]);
        return Ok(text.into_owned());
    }
    if looks_binary(bytes) {
        let what = match bytes.get(..4) {
            Some(b"\x7fELF") => "a program",
            Some([0x89, b'P', b'N', b'G']) | Some([0xff, 0xd8, 0xff, _]) | Some(b"GIF8") => "an image",
            _ => "binary data",
        };
        return Err(IngestError::Unsupported { name: name.into(), what: what.into() });
    }
    if let Ok(text) = std::str::from_utf8(bytes) {
        return Ok(text.to_owned());
    }
    let mut detector = chardetng::EncodingDetector::new();
    detector.feed(bytes, true);
    let encoding = detector.guess(None, true);
    tracing::info!(name, encoding = encoding.name(), "decoded a document that is not UTF-8");
    Ok(encoding.decode_without_bom_handling(bytes).0.into_owned())
}

/// NUL bytes, or many control characters, in the first 8 KiB: no text encoding without a BOM
/// has them (UTF-16 without one is rare enough to refuse).
fn looks_binary(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(8192)];
    let controls = head.iter().filter(|&&b| b < 0x20 && !matches!(b, b'\n' | b'\r' | b'\t' | 0x0c)).count();
    head.contains(&0) || controls * 20 > head.len()
}

/// Whether the text has Markdown's headings (`# Title` lines) or fences.
pub fn looks_like_markdown(text: &str) -> bool {
    text.lines().take(400).filter(|l| heading(l).is_some() || l.starts_with("```")).count() >= 2
}

fn heading(line: &str) -> Option<&str> {
    let hashes = line.bytes().take_while(|&b| b == b'#').count();
    let title = line[hashes..].strip_prefix(' ')?.trim().trim_end_matches('#').trim();
    ((1..=6).contains(&hashes) && !title.is_empty()).then_some(title)
}

/// A part per `#` heading, from the heading to the next one (code fences' insides excluded).
pub fn heading_parts(text: &str) -> Vec<Part> {
    let mut parts: Vec<Part> = Vec::new();
    let (mut at, mut fenced) = (0, false);
    for line in text.split_inclusive('\n') {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if let Some(title) = heading(line.trim_end()).filter(|_| !fenced) {
            if let Some(last) = parts.last_mut() {
                last.bytes.end = at;
            }
            parts.push(Part { locator: Locator::Heading(title.to_string()), bytes: at..text.len() });
        }
        at += line.len();
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_are_found_and_binary_refused() {
        assert_eq!(decode("a", "naïve café".as_bytes()).unwrap(), "naïve café");
        // windows-1252, as an old Windows editor saves it.
        let latin = b"Les na\xefves filles du caf\xe9 o\xf9 l'on danse, et les \xe9l\xe8ves \xe0 l'\xe9cole.";
        assert_eq!(decode("a", latin).unwrap(), "Les naïves filles du café où l'on danse, et les élèves à l'école.");
        let utf16: Vec<u8> =
            [0xff, 0xfe].into_iter().chain("héllo".encode_utf16().flat_map(u16::to_le_bytes)).collect();
        assert_eq!(decode("a", &utf16).unwrap(), "héllo");
        let elf = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0";
        assert!(matches!(decode("a.txt", elf), Err(IngestError::Unsupported { what, .. }) if what == "a program"));
    }

    #[test]
    fn markdown_headings_become_parts_outside_code_fences() {
        let text = "intro\n# One\nbody\n```\n# not a heading\n```\n## Two ##\nend\n";
        let parts = heading_parts(text);
        let titles: Vec<_> = parts.iter().map(|p| p.locator.clone()).collect();
        assert_eq!(titles, [Locator::Heading("One".into()), Locator::Heading("Two".into())]);
        assert_eq!(&text[parts[0].bytes.clone()], "# One\nbody\n```\n# not a heading\n```\n");
        assert_eq!(&text[parts[1].bytes.clone()], "## Two ##\nend\n");
        assert!(looks_like_markdown(text) && !looks_like_markdown("#hashtag\nplain"));
    }
}
