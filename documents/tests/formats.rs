//! Every format read from files built here (no documents written by others are committed),
//! and every way a file can be refused.

use hillside_documents::{read_bytes, read_file, Format, IngestError, Limits, Locator};
use std::io::Write;
use std::path::PathBuf;

fn read(name: &str, bytes: &[u8]) -> Result<hillside_documents::Document, IngestError> {
    read_bytes(name, bytes, &Limits::default())
}

/// The text of the part a locator names.
fn part_text<'a>(doc: &'a hillside_documents::Document, locator: &Locator) -> &'a str {
    let part = doc.parts.iter().find(|p| &p.locator == locator).unwrap_or_else(|| panic!("no part {locator:?} in {:?}", doc.parts));
    &doc.text[part.bytes.clone()]
}

/// A PDF whose pages show these lines of text (Helvetica), written object by object with a
/// correct cross-reference table.
fn pdf(pages: &[&[&str]]) -> Vec<u8> {
    let n = pages.len();
    // Objects: 1 catalog, 2 page tree, 3 font, then a page and its content stream per page.
    let mut objects: Vec<String> = vec![
        "<< /Type /Catalog /Pages 2 0 R >>".into(),
        format!("<< /Type /Pages /Kids [{}] /Count {n} >>", (0..n).map(|i| format!("{} 0 R", 4 + 2 * i)).collect::<Vec<_>>().join(" ")),
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
        write!(out, "{o:010} 00000 n \n").unwrap();
    }
    write!(out, "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n", objects.len() + 1).unwrap();
    out
}

/// A ZIP archive of these (path, contents) entries.
fn zip(entries: &[(&str, &str)]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (path, contents) in entries {
        let stored = *path == "mimetype"; // EPUB's first entry is stored, uncompressed
        let method = if stored { zip::CompressionMethod::Stored } else { zip::CompressionMethod::Deflated };
        writer.start_file(*path, zip::write::SimpleFileOptions::default().compression_method(method)).unwrap();
        writer.write_all(contents.as_bytes()).unwrap();
    }
    writer.finish().unwrap().into_inner()
}

fn docx() -> Vec<u8> {
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

fn epub() -> Vec<u8> {
    let chapter = |title: &str, body: &str| format!("<?xml version=\"1.0\"?><html xmlns=\"http://www.w3.org/1999/xhtml\"><head><title>{title}</title></head><body><h1>{title}</h1><p>{body}</p></body></html>");
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

#[test]
fn plain_text_of_the_gpl_reads_whole() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/gpl-3.0.txt");
    let doc = read_file(&path, &Limits::default()).unwrap();
    assert_eq!((doc.name.as_str(), doc.format), ("gpl-3.0.txt", Format::Text));
    assert_eq!(doc.text, std::fs::read_to_string(&path).unwrap());
    assert!(doc.parts.is_empty(), "plain text has no headings to cite");
}

#[test]
fn markdown_and_html_keep_their_headings() {
    let md = read("notes.md", b"# Budget\nWe spend 40 on rent.\n\n## Food\nBread and tea.\n").unwrap();
    assert_eq!(md.format, Format::Markdown);
    assert!(part_text(&md, &Locator::Heading("Food".into())).contains("Bread and tea."));
    let page = b"<!DOCTYPE html><html><head><title>T</title><style>p { color: red }</style><script>alert('hidden')</script></head>\
        <body><h1>Opening Hours</h1><p>Open daily &amp; late.</p><h2>Holidays</h2><p>Closed on the first of May.</p></body></html>";
    let html = read("page.html", page).unwrap();
    assert_eq!(html.format, Format::Html);
    assert!(!html.text.contains("alert") && !html.text.contains("color"), "no scripts or styles: {:?}", html.text);
    assert!(part_text(&html, &Locator::Heading("Opening Hours".into())).contains("Open daily & late."), "{:?}", html.text);
    assert!(part_text(&html, &Locator::Heading("Holidays".into())).contains("Closed on the first of May."));
}

#[test]
fn pdf_pages_are_parts() {
    let bytes = pdf(&[&["The river Thames rises in Gloucestershire", "and flows east to London."], &["Its estuary opens onto the North Sea."]]);
    let doc = read("rivers.pdf", &bytes).unwrap();
    assert_eq!((doc.format, doc.parts.len()), (Format::Pdf, 2));
    assert!(part_text(&doc, &Locator::Page(1)).contains("Gloucestershire"), "{:?}", doc.text);
    assert!(part_text(&doc, &Locator::Page(2)).contains("North Sea"), "{:?}", doc.text);
    let at = doc.text.find("estuary").unwrap();
    assert_eq!(doc.locate(at), Some(&Locator::Page(2)));
}

#[test]
fn docx_paragraphs_and_heading_styles() {
    let doc = read("lease.docx", &docx()).unwrap();
    assert_eq!(doc.format, Format::Docx);
    assert!(doc.text.starts_with("Tenancy & Terms\n\nThe tenant pays rent monthly.\n\n"), "{:?}", doc.text);
    assert!(part_text(&doc, &Locator::Heading("Deposits".into())).contains("two months"));
}

#[test]
fn epub_chapters_in_spine_order() {
    let doc = read("voyage.epub", &epub()).unwrap();
    assert_eq!(doc.format, Format::Epub);
    let (dawn, black) = (doc.text.find("Ships came in at dawn.").unwrap(), doc.text.find("By noon the sky was black.").unwrap());
    assert!(dawn < black, "spine order: {:?}", doc.text);
    assert_eq!(doc.locate(black), Some(&Locator::Heading("The Storm".into())), "{:?}", doc.parts);
}

#[test]
fn refused_files_say_why() {
    let err = |name: &str, bytes: &[u8]| read(name, bytes).unwrap_err();
    assert!(matches!(err("empty.txt", b""), IngestError::Empty { .. }));
    assert!(matches!(err("blank.txt", b" \n\n\t"), IngestError::Empty { .. }));
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01";
    assert!(matches!(err("photo.txt", png), IngestError::Unsupported { what, .. } if what == "an image"));
    let big = read_bytes("big.txt", &vec![b'a'; 2_000_000], &Limits { max_file_bytes: 1_000_000 }).unwrap_err();
    assert_eq!(big.to_string(), "big.txt is 2.0 MB, over the limit of 1.0 MB for a document");
    // Pages with no text: a scan.
    let scanned = err("scan.pdf", &pdf(&[&[], &[], &[]]));
    assert!(matches!(scanned, IngestError::Scanned { pages: 3, .. }), "{scanned}");
    assert!(scanned.to_string().contains("OCR"));
    // Encrypted with a password (by qpdf, which `make test` installs); with an empty user
    // password the same file opens for anyone, as in every PDF viewer.
    let encrypt = |user: &str| {
        let dir = std::env::temp_dir().join(format!("hillside-pdf-{}-{user}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (plain, locked) = (dir.join("plain.pdf"), dir.join("locked.pdf"));
        std::fs::write(&plain, pdf(&[&["Quarterly figures for the board."]])).unwrap();
        let status = std::process::Command::new("qpdf").args(["--encrypt", user, "owner-secret", "256", "--"]).arg(&plain).arg(&locked).status();
        assert!(status.expect("qpdf runs").success());
        let bytes = std::fs::read(&locked).unwrap();
        let _ = std::fs::remove_dir_all(dir);
        bytes
    };
    let locked = err("locked.pdf", &encrypt("user-secret"));
    assert!(matches!(locked, IngestError::Encrypted { .. }), "{locked}");
    let open = read("open.pdf", &encrypt("")).unwrap();
    assert!(open.text.contains("Quarterly figures"), "{:?}", open.text);
    // Not a PDF past its header.
    assert!(matches!(err("broken.pdf", b"%PDF-1.7\nthis is where the objects should be\n"), IngestError::Damaged { .. }));
    // A DOCX cut short, and a ZIP of something else.
    let docx = docx();
    assert!(matches!(err("cut.docx", &docx[..docx.len() / 2]), IngestError::Damaged { .. }));
    assert!(matches!(err("photos.zip", &zip(&[("a.jpg", "jpeg")])), IngestError::Unsupported { .. }));
}
