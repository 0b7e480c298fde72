//! HTML: the visible text (no scripts, styles or markup), headings kept as `#` lines so that
//! they become parts like Markdown's.

/// Whether decoded text is an HTML page rather than text that mentions a tag.
pub fn looks_like_html(text: &str) -> bool {
    let head = text.trim_start_matches('\u{feff}').trim_start();
    let head = head.get(..head.len().min(512)).unwrap_or(head).to_ascii_lowercase();
    head.starts_with("<!doctype html") || head.starts_with("<html") || (head.starts_with("<?xml") && head.contains("<html"))
}

/// The page's visible text, wrapped only at very long lines.
pub fn to_text(html: &str) -> String {
    html2text::config::plain().no_table_borders().string_from_read(html.as_bytes(), 10_000).unwrap_or_default()
}
