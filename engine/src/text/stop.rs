//! Stop strings: text is held back while it could still turn into a stop string, and a stop
//! string itself is never emitted.

#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        Self { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), pending: String::new() }
    }

    /// Feeds a delta; returns the text now safe to emit, and whether a stop string was hit.
    pub fn push(&mut self, delta: &str) -> (String, bool) {
        self.pending.push_str(delta);
        if let Some(at) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        let hold = self.held_suffix_len();
        let out = self.pending[..self.pending.len() - hold].to_string();
        self.pending.drain(..self.pending.len() - hold);
        (out, false)
    }

    /// Text held back at the end of generation (no stop string completed).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest suffix of `pending` that starts some stop string.
    fn held_suffix_len(&self) -> usize {
        let p = &self.pending;
        (1..=p.len())
            .rev()
            .filter(|&n| p.is_char_boundary(p.len() - n))
            .find(|&n| self.stops.iter().any(|s| s.starts_with(&p[p.len() - n..])))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_split_across_deltas_is_never_emitted() {
        let mut m = StopMatcher::new(&["\nUser:".to_string()]);
        let mut out = String::new();
        let mut stopped = false;
        for delta in ["Hello", " there\n", "Us", "er: next"] {
            let (text, hit) = m.push(delta);
            out.push_str(&text);
            stopped |= hit;
            if hit {
                break;
            }
        }
        assert!(stopped);
        assert_eq!(out, "Hello there");
    }

    #[test]
    fn held_text_is_released_when_it_stops_matching_and_multibyte_is_safe() {
        let mut m = StopMatcher::new(&["ab".to_string(), "é!".to_string()]);
        assert_eq!(m.push("xa"), ("x".to_string(), false));
        assert_eq!(m.push("c"), ("ac".to_string(), false));
        assert_eq!(m.push("ü é"), ("ü ".to_string(), false));
        assert_eq!(m.finish(), "é");
    }
}
