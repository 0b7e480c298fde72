//! Documents built here, for the tests of every format (no documents written by others are
//! committed).

#![allow(dead_code)] // each test binary uses its own subset

use std::io::Write;

/// A PDF whose pages show these lines of text (Helvetica), written object by object with a
/// correct cross-reference table.
pub fn pdf(pages: &[&[&str]]) -> Vec<u8> {
    let n = pages.len();
    // Objects: 1 catalog, 2 page tree, 3 font, then a page and its content stream per page.
    let mut objects: Vec<String> = vec![
        "<< /Type /Catalog /Pages 2 0 R >>".into(),
        format!(
            "<< /Type /Pages /Kids [{}] /Count {n} >>",
            (0..n).map(|i| format!("{} 0 R", 4 + 2 * i)).collect::<Vec<_>>().join(" ")
        ),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".into(),
    ];
    for (i, lines) in pages.iter().enumerate() {
        let mut content = String::from("BT /F1 12 Tf 72 720 Td 14 TL\n");
        for line in *lines {
            content.push_str(&format!("({}) Tj T*\n", line.replace('(', "\\(").replace(')', "\\)")));
        }
        content.push_str("ET");
        objects.push(format!("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents {} 0 R >>", 5 + 2 * i));
        objects.push(format!("<< /Length {} >>\nstream\n{content}\nendstream", content.len()));
    }
    let mut out = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, body) in objects.iter().enumerate() {
        offsets.push(out.len());
        write!(out, "{} 0 obj\n{body}\nendobj\n", i + 1).unwrap();
    }
    let xref = out.len();
    write!(out, "xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).unwrap();
    for o in offsets {
        writeln!(out, "{o:010} 00000 n ").unwrap();
    }
    write!(out, "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n", objects.len() + 1).unwrap();
    out
}

/// A ZIP archive of these (path, contents) entries.
pub fn zip(entries: &[(&str, &str)]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (path, contents) in entries {
        let stored = *path == "mimetype"; // EPUB's first entry is stored, uncompressed
        let method = if stored { zip::CompressionMethod::Stored } else { zip::CompressionMethod::Deflated };
        writer.start_file(*path, zip::write::SimpleFileOptions::default().compression_method(method)).unwrap();
        writer.write_all(contents.as_bytes()).unwrap();
    }
    writer.finish().unwrap().into_inner()
}

pub fn docx() -> Vec<u8> {
    let paragraph = |style: Option<&str>, text: &str| {
        let style = style.map_or(String::new(), |s| format!("<w:pPr><w:pStyle w:val=\"{s}\"/></w:pPr>"));
        format!("<w:p>{style}<w:r><w:t xml:space=\"preserve\">{text}</w:t></w:r></w:p>")
    };
    let body = [
        paragraph(Some("Title"), "Tenancy &amp; Terms"),
        paragraph(None, "The tenant pays rent monthly."),
        paragraph(Some("Heading1"), "Deposits"),
        paragraph(None, "A deposit of two months is held."),
    ]
    .concat();
    let document = format!("<?xml version=\"1.0\"?><w:document xmlns:w=\"http://schemas.openxmlformats.org/wordprocessingml/2006/main\"><w:body>{body}</w:body></w:document>");
    zip(&[("[Content_Types].xml", "<?xml version=\"1.0\"?><Types/>"), ("word/document.xml", &document)])
}

pub fn epub() -> Vec<u8> {
    let chapter = |title: &str, body: &str| {
        format!("<?xml version=\"1.0\"?><html xmlns=\"http://www.w3.org/1999/xhtml\"><head><title>{title}</title></head><body><h1>{title}</h1><p>{body}</p></body></html>")
    };
    let container = "<?xml version=\"1.0\"?><container version=\"1.0\" xmlns=\"urn:oasis:names:tc:opendocument:xmlns:container\"><rootfiles><rootfile full-path=\"OEBPS/content.opf\" media-type=\"application/oebps-package+xml\"/></rootfiles></container>";
    // The manifest lists chapter two first; the spine reads chapter one first.
    let opf = "<?xml version=\"1.0\"?><package xmlns=\"http://www.idpf.org/2007/opf\" version=\"3.0\"><manifest>\
        <item id=\"c2\" href=\"text/chapter%202.xhtml\" media-type=\"application/xhtml+xml\"/>\
        <item id=\"c1\" href=\"text/one.xhtml\" media-type=\"application/xhtml+xml\"/></manifest>\
        <spine><itemref idref=\"c1\"/><itemref idref=\"c2\"/></spine></package>";
    zip(&[
        ("mimetype", "application/epub+zip"),
        ("META-INF/container.xml", container),
        ("OEBPS/content.opf", opf),
        ("OEBPS/text/one.xhtml", &chapter("The Harbour", "Ships came in at dawn.")),
        ("OEBPS/text/chapter 2.xhtml", &chapter("The Storm", "By noon the sky was black.")),
    ])
}

/// A DOCX whose `word/document.xml` is `document`.
pub fn docx_xml(document: &str) -> Vec<u8> {
    zip(&[("[Content_Types].xml", "<?xml version=\"1.0\"?><Types/>"), ("word/document.xml", document)])
}

/// An EPUB of these XHTML chapters, read in this order.
pub fn epub_chapters(chapters: &[&str]) -> Vec<u8> {
    let container = "<?xml version=\"1.0\"?><container version=\"1.0\" xmlns=\"urn:oasis:names:tc:opendocument:xmlns:container\"><rootfiles><rootfile full-path=\"content.opf\" media-type=\"application/oebps-package+xml\"/></rootfiles></container>";
    let items: String = (0..chapters.len())
        .map(|i| format!("<item id=\"c{i}\" href=\"c{i}.xhtml\" media-type=\"application/xhtml+xml\"/>"))
        .collect();
    let spine: String = (0..chapters.len()).map(|i| format!("<itemref idref=\"c{i}\"/>")).collect();
    let opf = format!("<?xml version=\"1.0\"?><package xmlns=\"http://www.idpf.org/2007/opf\" version=\"3.0\"><manifest>{items}</manifest><spine>{spine}</spine></package>");
    let names: Vec<String> = (0..chapters.len()).map(|i| format!("c{i}.xhtml")).collect();
    let mut entries = vec![
        ("mimetype", "application/epub+zip"),
        ("META-INF/container.xml", container),
        ("content.opf", opf.as_str()),
    ];
    entries.extend(names.iter().map(String::as_str).zip(chapters.iter().copied()));
    zip(&entries)
}

/// An HTML page whose text sits inside `depth` nested `tag`s.
pub fn nested_html(tag: &str, depth: usize) -> String {
    format!(
        "<!doctype html><html><body>{}Deep inside the page.{}</body></html>",
        format!("<{tag}>").repeat(depth),
        format!("</{tag}>").repeat(depth)
    )
}
