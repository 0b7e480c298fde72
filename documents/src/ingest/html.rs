//! HTML: the visible text (no scripts, styles or markup), headings kept as `#` lines so that
//! they become parts like Markdown's.
//!
//! Nesting is bounded twice. The HTML parser's tree builder scans its stack of open elements at
//! each tag, so 100,000 nested `<div>` take minutes to parse, and the text renderer recurses
//! once per level, so 50,000 nested `<blockquote>` overflow a thread's stack. A linear scan of
//! the tags refuses such a page before the parser sees it ([`estimated_depth_over`]); the
//! parsed tree's real depth is checked again before rendering, since the tree builder can make
//! elements no tag opened.

use html2text::Handle;
use std::collections::HashMap;

/// Whether decoded text is an HTML page rather than text that mentions a tag.
pub fn looks_like_html(text: &str) -> bool {
    let head = text.trim_start_matches('\u{feff}').trim_start();
    let head = head.get(..head.len().min(512)).unwrap_or(head).to_ascii_lowercase();
    head.starts_with("<!doctype html")
        || head.starts_with("<html")
        || (head.starts_with("<?xml") && head.contains("<html"))
}

/// The page's visible text, wrapped only at very long lines; `Err` says how deep the page
/// nests when that is over `max_depth`.
pub fn to_text(html: &str, max_depth: usize) -> Result<String, String> {
    let too_deep = |depth: usize| format!("its elements nest {depth} deep or more, over the limit of {max_depth}");
    if let Some(depth) = estimated_depth_over(html, max_depth) {
        return Err(too_deep(depth));
    }
    let config = html2text::config::plain().no_table_borders();
    let Ok(dom) = config.parse_html(html.as_bytes()) else { return Ok(String::new()) };
    if let Some(depth) = tree_depth_over(&dom.document, max_depth) {
        return Err(too_deep(depth));
    }
    Ok(config.dom_to_render_tree(&dom).and_then(|tree| config.render_to_string(tree, 10_000)).unwrap_or_default())
}

/// The depth of the deepest element, once it is over `max` (without recursion).
fn tree_depth_over(root: &Handle, max: usize) -> Option<usize> {
    let mut pending = vec![(root.clone(), 0usize)];
    while let Some((node, depth)) = pending.pop() {
        if depth > max {
            return Some(depth);
        }
        pending.extend(node.children.borrow().iter().map(|child| (child.clone(), depth + 1)));
    }
    None
}

/// Elements that never have content.
const VOID: &[&str] = &[
    "area", "base", "basefont", "bgsound", "br", "col", "embed", "frame", "hr", "img", "input", "keygen", "link",
    "meta", "param", "source", "track", "wbr",
];
/// Elements whose content is text up to their end tag, not markup.
const RAW_TEXT: &[&str] = &["script", "style", "textarea", "title", "xmp", "iframe", "noembed", "noframes"];
/// Elements a like one closes: a new `<li>` ends the open `<li>`, and so on.
const SIBLING_GROUPS: &[&[&str]] = &[
    &["p"],
    &["li"],
    &["dt", "dd"],
    &["option"],
    &["optgroup"],
    &["tr"],
    &["td", "th"],
    &["thead", "tbody", "tfoot"],
    &["rb", "rt", "rp", "rtc"],
];

/// How deep the page's tags nest, once that is over `max`: an estimate from the tags alone (end
/// tags close what they name and everything inside it, as the tree builder does), in one pass.
fn estimated_depth_over(html: &str, max: usize) -> Option<usize> {
    let bytes = html.as_bytes();
    let mut open: Vec<String> = Vec::new();
    let mut open_names: HashMap<String, usize> = HashMap::new();
    let mut foreign = 0usize; // open <svg> and <math>, inside which `<x/>` closes itself
    let mut at = 0;
    while let Some(offset) = memchr(b'<', &bytes[at..]) {
        at += offset + 1;
        let rest = &bytes[at..];
        if rest.starts_with(b"!--") {
            at += find(rest, b"-->").map_or(rest.len(), |end| end + 3);
            continue;
        }
        if rest.first().is_some_and(|&b| b == b'!' || b == b'?') {
            at += memchr(b'>', rest).map_or(rest.len(), |end| end + 1);
            continue;
        }
        let closing = rest.first() == Some(&b'/');
        let name_start = usize::from(closing);
        let name_len = rest[name_start..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b':' | b'_'))
            .count();
        if name_len == 0 || !rest[name_start].is_ascii_alphabetic() {
            continue; // text such as `a < b`
        }
        let name = String::from_utf8_lossy(&rest[name_start..name_start + name_len]).to_ascii_lowercase();
        let tag_len = tag_end(&rest[name_start + name_len..]).map_or(rest.len(), |end| name_start + name_len + end);
        let self_closing = tag_len >= 2 && rest[tag_len - 2] == b'/';
        at += tag_len;
        if closing {
            // Only a name that is open is looked for, so each element is passed over once
            // when it closes, not once per stray end tag.
            let is_open = open_names.get(&name).is_some_and(|&n| n > 0);
            if let Some(i) = is_open.then(|| open.iter().rposition(|n| *n == name)).flatten() {
                for closed in open.drain(i..) {
                    foreign = foreign.saturating_sub(usize::from(matches!(closed.as_str(), "svg" | "math")));
                    open_names.entry(closed).and_modify(|n| *n = n.saturating_sub(1));
                }
            }
            continue;
        }
        if VOID.contains(&name.as_str())
            || matches!(name.as_str(), "html" | "head" | "body")
            || (self_closing && foreign > 0)
        {
            continue;
        }
        if RAW_TEXT.contains(&name.as_str()) {
            let end = format!("</{name}");
            at += find_ignoring_case(&bytes[at..], end.as_bytes()).unwrap_or(bytes.len() - at);
            continue;
        }
        if let Some(group) = SIBLING_GROUPS.iter().find(|g| g.contains(&name.as_str())) {
            if let Some(closed) = open.pop_if(|top| group.contains(&top.as_str())) {
                open_names.entry(closed).and_modify(|n| *n = n.saturating_sub(1));
            }
        }
        foreign += usize::from(matches!(name.as_str(), "svg" | "math"));
        *open_names.entry(name.clone()).or_default() += 1;
        open.push(name);
        if open.len() > max {
            return Some(open.len());
        }
    }
    None
}

/// Where a tag's `>` is in `rest` (just after its name), quoted attribute values skipped.
fn tag_end(rest: &[u8]) -> Option<usize> {
    let mut quote = None;
    for (i, &b) in rest.iter().enumerate() {
        match (quote, b) {
            (None, b'"' | b'\'') => quote = Some(b),
            (Some(q), _) if b == q => quote = None,
            (None, b'>') => return Some(i + 1),
            _ => {}
        }
    }
    None
}

fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&b| b == needle)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn find_ignoring_case(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w.eq_ignore_ascii_case(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(tag: &str, depth: usize) -> String {
        format!(
            "<!doctype html><html><body>{}deep text{}</body></html>",
            format!("<{tag}>").repeat(depth),
            format!("</{tag}>").repeat(depth)
        )
    }

    #[test]
    fn real_pages_pass_the_estimate() {
        let page = "<!doctype html><html><head><title>a <b> title</title><style>p > a {}</style><script>if (a < b && c > d) { x = '<div>'; }</script></head>\
            <body><!-- <div><div> --><ul><li>one<li>two<li>three</ul><p>para<p>para <img src=x><br>\
            <svg><path d='M0 0'/><path/><circle/></svg><table><tr><td>1<td>2<tr><td>3</table>\
            <select><option>a<option>b</select><div><span><b><i>x</i></b></span></div></body></html>";
        assert_eq!(estimated_depth_over(page, 8), None);
        let text = to_text(page, 8).unwrap();
        assert!(text.contains("three") && text.contains("para") && !text.contains("x = "), "{text}");
    }

    #[test]
    fn deep_nesting_is_refused_before_parsing() {
        assert_eq!(estimated_depth_over(&nested("div", 600), 512), Some(513));
        assert!(estimated_depth_over(&nested("div", 500), 512).is_none());
        // `<div/>` opens a div in HTML (outside SVG and MathML).
        assert_eq!(estimated_depth_over(&"<div/>".repeat(1000), 512), Some(513));
        let err = to_text(&nested("blockquote", 50_000), 512).unwrap_err();
        assert!(err.contains("over the limit of 512"), "{err}");
    }

    #[test]
    fn a_page_at_the_limit_renders_on_a_small_stack() {
        // Test threads have 2 MiB of stack, as the server's blocking threads do.
        let text = to_text(&nested("blockquote", 500), 512).unwrap();
        assert!(text.contains("deep text"), "{text}");
    }

    #[test]
    fn the_parsed_trees_depth_is_measured_without_recursion() {
        let dom = html2text::config::plain().parse_html(nested("div", 20_000).as_bytes()).unwrap();
        // html, body, then the divs.
        assert_eq!(tree_depth_over(&dom.document, 512), Some(513));
        assert_eq!(tree_depth_over(&dom.document, 30_000), None);
    }
}
