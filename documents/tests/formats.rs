//! Every format read from files built here (no documents written by others are committed),
//! and every way a file can be refused.

mod common;

use common::{docx, docx_xml, epub, epub_chapters, nested_html, pdf, zip};
use hillside_documents::ingest::Bound;
use hillside_documents::{read_bytes, read_file, Format, IngestError, Limits, Locator};
use std::path::PathBuf;

fn read(name: &str, bytes: &[u8]) -> Result<hillside_documents::Document, IngestError> {
    read_bytes(name, bytes, &Limits::default())
}

/// The text of the part a locator names.
fn part_text<'a>(doc: &'a hillside_documents::Document, locator: &Locator) -> &'a str {
    let part = doc
        .parts
        .iter()
        .find(|p| &p.locator == locator)
        .unwrap_or_else(|| panic!("no part {locator:?} in {:?}", doc.parts));
    &doc.text[part.bytes.clone()]
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
    assert!(
        part_text(&html, &Locator::Heading("Opening Hours".into())).contains("Open daily & late."),
        "{:?}",
        html.text
    );
    assert!(part_text(&html, &Locator::Heading("Holidays".into())).contains("Closed on the first of May."));
}

#[test]
fn pdf_pages_are_parts() {
    let bytes = pdf(&[
        &["The river Thames rises in Gloucestershire", "and flows east to London."],
        &["Its estuary opens onto the North Sea."],
    ]);
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
    let (dawn, black) =
        (doc.text.find("Ships came in at dawn.").unwrap(), doc.text.find("By noon the sky was black.").unwrap());
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
    let big = read_bytes("big.txt", &vec![b'a'; 2_000_000], &Limits { max_file_bytes: 1_000_000, ..Limits::default() })
        .unwrap_err();
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
        let status = std::process::Command::new("qpdf")
            .args(["--encrypt", user, "owner-secret", "256", "--"])
            .arg(&plain)
            .arg(&locked)
            .status();
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
    assert!(matches!(
        err("broken.pdf", b"%PDF-1.7\nthis is where the objects should be\n"),
        IngestError::Damaged { .. }
    ));
    // A DOCX cut short, and a ZIP of something else.
    let docx = docx();
    assert!(matches!(err("cut.docx", &docx[..docx.len() / 2]), IngestError::Damaged { .. }));
    assert!(matches!(err("photos.zip", &zip(&[("a.jpg", "jpeg")])), IngestError::Unsupported { .. }));
}

fn over_limit(e: IngestError) -> (Bound, String) {
    match e {
        IngestError::OverLimit { bound, .. } => (bound, e.to_string()),
        other => panic!("expected a bound, got: {other}"),
    }
}

#[test]
fn archives_are_read_within_their_budget() {
    let small = Limits { max_unpacked_bytes: 1_000_000, max_archive_entries: 8, ..Limits::default() };
    // Two megabytes of paragraphs compress to a few kilobytes.
    let paragraphs = "<w:p><w:r><w:t>All work and no play.</w:t></w:r></w:p>".repeat(40_000);
    let doc = format!("<?xml version=\"1.0\"?><w:document xmlns:w=\"http://schemas.openxmlformats.org/wordprocessingml/2006/main\"><w:body>{paragraphs}</w:body></w:document>");
    let bomb = docx_xml(&doc);
    assert!(bomb.len() < 100_000, "{}", bomb.len());
    let (bound, message) = over_limit(read_bytes("bomb.docx", &bomb, &small).unwrap_err());
    assert_eq!(bound, Bound::UnpackedBytes);
    assert!(message.contains("unpacks to more than 1.0 MB") && message.contains("word/document.xml"), "{message}");
    assert!(read_bytes("bomb.docx", &bomb, &Limits::default()).is_ok(), "within the default budget");
    // The budget is the archive's, not each entry's: chapters add up.
    let chapter = format!("<html><body><p>{}</p></body></html>", "Rain on the harbour. ".repeat(20_000));
    let (bound, _) =
        over_limit(read_bytes("long.epub", &epub_chapters(&[&chapter, &chapter, &chapter]), &small).unwrap_err());
    assert_eq!(bound, Bound::UnpackedBytes);
    let many: Vec<String> = (0..20).map(|i| format!("<p>chapter {i}</p>")).collect();
    let (bound, message) = over_limit(
        read_bytes("many.epub", &epub_chapters(&many.iter().map(String::as_str).collect::<Vec<_>>()), &small)
            .unwrap_err(),
    );
    assert_eq!(bound, Bound::ArchiveEntries);
    assert!(message.contains("over the limit of 8"), "{message}");
}

#[test]
fn deep_nesting_is_refused_in_every_markup() {
    let (bound, message) = over_limit(read("deep.html", nested_html("blockquote", 50_000).as_bytes()).unwrap_err());
    assert_eq!(bound, Bound::NestingDepth);
    assert!(message.contains("over the limit of 512"), "{message}");
    assert!(read("fine.html", nested_html("blockquote", 100).as_bytes())
        .unwrap()
        .text
        .contains("Deep inside the page."));
    let deep_docx = format!(
        "<?xml version=\"1.0\"?><w:document xmlns:w=\"w\"><w:body>{}</w:body></w:document>",
        "<w:sdt>".repeat(10_000) + &"</w:sdt>".repeat(10_000)
    );
    assert_eq!(over_limit(read("deep.docx", &docx_xml(&deep_docx)).unwrap_err()).0, Bound::NestingDepth);
    let deep_chapter = nested_html("div", 100_000);
    let (bound, message) = over_limit(
        read("deep.epub", &epub_chapters(&["<html><body><p>Fine.</p></body></html>", &deep_chapter])).unwrap_err(),
    );
    assert_eq!(bound, Bound::NestingDepth);
    assert!(message.contains("c1.xhtml"), "{message}");
}

#[test]
fn text_and_pages_are_bounded() {
    let few_pages = Limits { max_pdf_pages: 2, ..Limits::default() };
    let (bound, message) =
        over_limit(read_bytes("long.pdf", &pdf(&[&["One."], &["Two."], &["Three."]]), &few_pages).unwrap_err());
    assert_eq!(bound, Bound::PdfPages);
    assert!(message.contains("3 pages"), "{message}");
    let little_text = Limits { max_text_bytes: 1_000, ..Limits::default() };
    let (bound, _) = over_limit(read_bytes("long.txt", "word ".repeat(1_000).as_bytes(), &little_text).unwrap_err());
    assert_eq!(bound, Bound::TextBytes);
}
