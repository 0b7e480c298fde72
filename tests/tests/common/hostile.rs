//! Files made to hurt a reader, built here in a moment: ZIPs that inflate a thousandfold or
//! more, and markup nested far past any real page.

use flate2::{Compress, Compression, Crc, FlushCompress};

/// A raw deflate stream of `prefix`, then `zeros_mib` MiB of zero bytes. Each MiB is compressed
/// once after a full flush (which empties the compressor's history), so the same kilobyte of
/// output stands for every MiB and a stream of gigabytes is built in milliseconds.
fn deflated(prefix: &[u8], zeros_mib: u64) -> Vec<u8> {
    let mut compressor = Compress::new(Compression::best(), false);
    let mut segment = |input: &[u8], flush| {
        let mut out = Vec::with_capacity(input.len() / 100 + 1024);
        compressor.compress_vec(input, &mut out, flush).unwrap();
        out
    };
    let head = segment(prefix, FlushCompress::Full);
    let mib = segment(&vec![0u8; 1 << 20], FlushCompress::Full);
    let tail = segment(&[], FlushCompress::Finish);
    let mut stream = head;
    for _ in 0..zeros_mib {
        stream.extend_from_slice(&mib);
    }
    stream.extend_from_slice(&tail);
    stream
}

/// One entry of [`zip`]: its name, the size its headers declare once inflated, its deflated
/// bytes, and the CRC of the inflated ones (0 for a bomb: a reader that checks it has read too
/// far).
struct Entry<'a> {
    name: &'a str,
    inflated_bytes: u64,
    deflated: Vec<u8>,
    crc32: u32,
}

/// A ZIP of deflated entries, with ZIP64 sizes where they pass 4 GiB.
fn zip(entries: &[Entry<'_>]) -> Vec<u8> {
    let (mut out, mut central) = (Vec::new(), Vec::new());
    for entry in entries {
        let offset = out.len() as u32;
        let zip64 = entry.inflated_bytes >= u32::MAX as u64;
        let (inflated32, deflated32) =
            if zip64 { (u32::MAX, u32::MAX) } else { (entry.inflated_bytes as u32, entry.deflated.len() as u32) };
        let mut extra = Vec::new();
        if zip64 {
            extra.extend_from_slice(&1u16.to_le_bytes());
            extra.extend_from_slice(&16u16.to_le_bytes());
            extra.extend_from_slice(&entry.inflated_bytes.to_le_bytes());
            extra.extend_from_slice(&(entry.deflated.len() as u64).to_le_bytes());
        }
        let version: u16 = if zip64 { 45 } else { 20 };
        let name = entry.name.as_bytes();
        // Local header: signature, version, flags, method 8 (deflate), time, date, CRC, sizes,
        // name and extra lengths.
        out.extend_from_slice(&0x04034b50u32.to_le_bytes());
        for v in [version, 0, 8, 0, 0x21] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [entry.crc32, deflated32, inflated32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(&(extra.len() as u16).to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&extra);
        out.extend_from_slice(&entry.deflated);
        // Central directory entry.
        central.extend_from_slice(&0x02014b50u32.to_le_bytes());
        for v in [version, version, 0, 8, 0, 0x21] {
            central.extend_from_slice(&v.to_le_bytes());
        }
        for v in [entry.crc32, deflated32, inflated32] {
            central.extend_from_slice(&v.to_le_bytes());
        }
        for v in [name.len() as u16, extra.len() as u16, 0, 0, 0] {
            central.extend_from_slice(&v.to_le_bytes());
        }
        central.extend_from_slice(&0u32.to_le_bytes()); // external attributes
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name);
        central.extend_from_slice(&extra);
    }
    let central_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x06054b50u32.to_le_bytes());
    for v in [0u16, 0, entries.len() as u16, entries.len() as u16] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&central_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

fn deflated_entry<'a>(name: &'a str, text: &str) -> Entry<'a> {
    let mut crc = Crc::new();
    crc.update(text.as_bytes());
    Entry { name, inflated_bytes: text.len() as u64, deflated: deflated(text.as_bytes(), 0), crc32: crc.sum() }
}

/// A DOCX whose `word/document.xml` inflates to `gib` GiB (its headers say so, as ZIP64 must).
pub fn docx_bomb(gib: u64) -> Vec<u8> {
    let prefix = b"<?xml version=\"1.0\"?><w:document xmlns:w=\"w\"><w:body><w:p><w:r><w:t>";
    zip(&[Entry {
        name: "word/document.xml",
        inflated_bytes: prefix.len() as u64 + (gib << 30),
        deflated: deflated(prefix, gib << 10),
        crc32: 0,
    }])
}

/// An EPUB whose spine reads one chapter of `chapter_mib` MiB `times` times: each read is
/// within any per-entry limit, and together they inflate to `chapter_mib × times` MiB.
pub fn epub_spine_bomb(chapter_mib: u64, times: usize) -> Vec<u8> {
    let container =
        "<?xml version=\"1.0\"?><container><rootfiles><rootfile full-path=\"content.opf\"/></rootfiles></container>";
    let spine = "<itemref idref=\"c\"/>".repeat(times);
    let opf = format!("<?xml version=\"1.0\"?><package><manifest><item id=\"c\" href=\"c.xhtml\"/></manifest><spine>{spine}</spine></package>");
    let prefix = b"<html><body><p>";
    zip(&[
        deflated_entry("META-INF/container.xml", container),
        deflated_entry("content.opf", &opf),
        Entry {
            name: "c.xhtml",
            inflated_bytes: prefix.len() as u64 + (chapter_mib << 20),
            deflated: deflated(prefix, chapter_mib),
            crc32: 0,
        },
    ])
}

/// An HTML page whose text sits inside `depth` nested `tag`s.
pub fn nested_html(tag: &str, depth: usize) -> String {
    format!(
        "<!doctype html><html><body>{}Deep inside the page.{}</body></html>",
        format!("<{tag}>").repeat(depth),
        format!("</{tag}>").repeat(depth)
    )
}

/// A DOCX whose body nests `depth` content controls.
pub fn nested_docx(depth: usize) -> Vec<u8> {
    let xml = format!("<?xml version=\"1.0\"?><w:document xmlns:w=\"w\"><w:body>{}<w:p><w:r><w:t>Deep.</w:t></w:r></w:p>{}</w:body></w:document>", "<w:sdt>".repeat(depth), "</w:sdt>".repeat(depth));
    zip(&[deflated_entry("word/document.xml", &xml)])
}

/// An EPUB whose one chapter nests `depth` `<div>`s.
pub fn nested_epub(depth: usize) -> Vec<u8> {
    let container =
        "<?xml version=\"1.0\"?><container><rootfiles><rootfile full-path=\"content.opf\"/></rootfiles></container>";
    let opf = "<?xml version=\"1.0\"?><package><manifest><item id=\"c\" href=\"c.xhtml\"/></manifest><spine><itemref idref=\"c\"/></spine></package>";
    zip(&[
        deflated_entry("META-INF/container.xml", container),
        deflated_entry("content.opf", opf),
        deflated_entry("c.xhtml", &nested_html("div", depth)),
    ])
}
