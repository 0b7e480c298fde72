//! Merging score blocks into the global top-k as they arrive, without waiting for the rest.

/// (position, score) pairs for a chunk of tokens, as an evaluator emits them: a score per KV
/// head and token, `scores[head][i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreBlock {
    pub tokens: Vec<u32>,
    pub scores: Vec<f32>,
    /// When the evaluator finished the block (the host measures how long it waited to merge).
    pub produced: std::time::Instant,
}

impl ScoreBlock {
    /// A block of `tokens` with room for the scores of `n_heads` heads.
    pub fn new(tokens: Vec<u32>, n_heads: usize) -> Self {
        Self { scores: vec![0.0; n_heads * tokens.len()], tokens, produced: std::time::Instant::now() }
    }

    pub fn head(&self, h: usize) -> &[f32] {
        &self.scores[h * self.tokens.len()..][..self.tokens.len()]
    }
}

/// A (score, token) pair as one integer that orders like the ranking: higher score first, then
/// lower token, NaN lowest. The selection below then compares plain integers, several times
/// faster than comparing pairs of floats.
fn rank_key(score: f32, token: u32) -> u64 {
    let score = if score.is_nan() { f32::NEG_INFINITY } else { score };
    let bits = score.to_bits();
    // Flip negatives entirely and set the sign bit of positives: the bits then order like the
    // floats.
    let ordered = if bits >> 31 == 1 { !bits } else { bits | 1 << 31 };
    u64::from(ordered) << 32 | u64::from(u32::MAX - token)
}

fn unrank_key(key: u64) -> (f32, u32) {
    let ordered = (key >> 32) as u32;
    let bits = if ordered >> 31 == 1 { ordered & !(1 << 31) } else { !ordered };
    (f32::from_bits(bits), u32::MAX - key as u32)
}

/// The k best tokens seen so far. Blocks are appended as they arrive and the buffer is cut back
/// to the best k (a linear-time selection) whenever it doubles, so merging costs O(1) per score
/// rather than a heap's O(log k). After a cut, a score that does not beat the worst one kept can
/// never enter, so it is not even appended: past the first few blocks most scores stop there.
pub struct TopK {
    k: usize,
    /// [`rank_key`]s.
    kept: Vec<u64>,
    /// The worst key kept at the last cut (0, which every key beats, before the first).
    floor: u64,
    /// The floor's score: a score below it cannot beat the floor, whatever its token.
    floor_score: f32,
}

impl TopK {
    pub fn new(k: usize) -> Self {
        Self { k, kept: Vec::with_capacity(2 * k.max(SCORE_BLOCK_MIN)), floor: 0, floor_score: f32::NEG_INFINITY }
    }

    pub fn merge(&mut self, tokens: &[u32], scores: &[f32]) {
        if self.k == 0 {
            return;
        }
        let floor_score = self.floor_score;
        // Most scores fall below the floor's: one float compare drops them before a key is built.
        let above = scores.iter().zip(tokens).filter(|&(&s, _)| s >= floor_score || s.is_nan());
        self.keep_above_floor(above.map(|(&s, &t)| rank_key(s, t)));
    }

    /// Takes in what another top-k of the same k kept (of other tokens' scores).
    pub fn absorb(&mut self, other: TopK) {
        self.keep_above_floor(other.kept.into_iter());
    }

    /// Appends the keys that beat the floor, cutting back to k once the buffer has doubled.
    fn keep_above_floor(&mut self, keys: impl Iterator<Item = u64>) {
        let floor = self.floor;
        self.kept.extend(keys.filter(|&key| key > floor));
        if self.kept.len() >= 2 * self.k.max(SCORE_BLOCK_MIN) {
            self.cut();
        }
    }

    fn cut(&mut self) {
        if self.kept.len() > self.k {
            let dropped = self.kept.len() - self.k;
            self.kept.select_nth_unstable(dropped);
            self.kept.drain(..dropped);
            self.floor = self.kept[0];
            self.floor_score = unrank_key(self.floor).0;
        }
    }

    /// The chosen (score, token) pairs, best first.
    pub fn into_ranked(mut self) -> Vec<(f32, u32)> {
        self.cut();
        self.kept.sort_unstable_by(|a, b| b.cmp(a));
        self.kept.into_iter().map(unrank_key).collect()
    }

    /// The chosen (score, token) pairs in no particular order, for callers that weigh or
    /// filter them all: sorting a few thousand per head and layer is a decode step's largest
    /// sort.
    pub fn into_unordered(mut self) -> Vec<(f32, u32)> {
        self.cut();
        self.kept.into_iter().map(unrank_key).collect()
    }

    /// The chosen tokens, ascending.
    pub fn into_tokens(mut self) -> Vec<u32> {
        self.cut();
        ascending(self.kept.into_iter().map(|key| unrank_key(key).1).collect())
    }
}

/// `tokens` (distinct) in ascending order. A selection holds a dense share of its range (a
/// fifth of the context), so marking them in a bitmap and reading it back beats sorting them
/// several times over; a sparse set is sorted.
pub fn ascending(mut tokens: Vec<u32>) -> Vec<u32> {
    let words = tokens.iter().max().map_or(0, |&m| m as usize / 64 + 1);
    if words > 4 * tokens.len() {
        tokens.sort_unstable();
        return tokens;
    }
    let mut bits = vec![0u64; words];
    for &t in &tokens {
        bits[t as usize / 64] |= 1 << (t % 64);
    }
    tokens.clear();
    for (w, mut word) in bits.into_iter().enumerate() {
        while word != 0 {
            tokens.push(w as u32 * 64 + word.trailing_zeros());
            word &= word - 1;
        }
    }
    tokens
}

/// Smallest buffer [`TopK`] keeps before cutting, so tiny k does not cut every block.
const SCORE_BLOCK_MIN: usize = 256;

/// A [`TopK`] for each KV head.
pub struct HeadsTopK(Vec<TopK>);

impl HeadsTopK {
    pub fn new(n_heads: usize, k: usize) -> Self {
        Self((0..n_heads).map(|_| TopK::new(k)).collect())
    }

    pub fn merge(&mut self, block: &ScoreBlock) {
        for (h, top) in self.0.iter_mut().enumerate() {
            top.merge(&block.tokens, block.head(h));
        }
    }

    pub fn absorb(&mut self, other: HeadsTopK) {
        self.0.iter_mut().zip(other.0).for_each(|(top, other)| top.absorb(other));
    }

    /// Each head's chosen tokens, ascending.
    pub fn into_tokens(self) -> Vec<Vec<u32>> {
        self.0.into_iter().map(TopK::into_tokens).collect()
    }

    /// Each head's chosen (score, token) pairs, best first.
    pub fn into_ranked(self) -> Vec<Vec<(f32, u32)>> {
        self.0.into_iter().map(TopK::into_ranked).collect()
    }

    /// Each head's chosen (score, token) pairs, in no particular order.
    pub fn into_unordered(self) -> Vec<Vec<(f32, u32)>> {
        self.0.into_iter().map(TopK::into_unordered).collect()
    }
}

/// A running log-sum-exp of `scale`·score per head: the softmax normalizer of every score
/// merged, so the share of it that a chosen set holds can be told once the scan ends.
pub struct HeadsMass {
    scale: f32,
    max: Vec<f32>,
    /// Σ exp(scale·s − max), per head, sinks included.
    sum: Vec<f64>,
    /// Per head, its sink logit (−∞ without one).
    sink: Vec<f32>,
}

impl HeadsMass {
    pub fn new(n_heads: usize, scale: f32) -> Self {
        Self {
            scale,
            max: vec![f32::NEG_INFINITY; n_heads],
            sum: vec![0.0; n_heads],
            sink: vec![f32::NEG_INFINITY; n_heads],
        }
    }

    /// Head `h`'s sink logit (gpt-oss's): a key with no value in the softmax, attended to
    /// whatever is selected, so its share of the mass always counts as captured.
    pub fn add_sink(&mut self, h: usize, logit: f32) {
        let max = self.max[h].max(logit);
        self.sum[h] = self.sum[h] * f64::from(self.max[h] - max).exp() + f64::from(logit - max).exp();
        self.max[h] = max;
        self.sink[h] = logit;
    }

    pub fn merge(&mut self, block: &ScoreBlock) {
        for h in 0..self.max.len() {
            let scores = block.head(h);
            let block_max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s * self.scale));
            if block_max == f32::NEG_INFINITY {
                continue;
            }
            let max = self.max[h].max(block_max);
            let rescale = f64::from(self.max[h] - max).exp();
            let added: f64 = scores.iter().map(|&s| f64::from(s * self.scale - max).exp()).sum();
            self.sum[h] = self.sum[h] * rescale + added;
            self.max[h] = max;
        }
    }

    /// Takes in the normalizers another mass (of the same scale) summed over other scores.
    pub fn absorb(&mut self, other: HeadsMass) {
        for h in 0..self.max.len() {
            if other.max[h] == f32::NEG_INFINITY {
                continue;
            }
            let max = self.max[h].max(other.max[h]);
            self.sum[h] =
                self.sum[h] * f64::from(self.max[h] - max).exp() + other.sum[h] * f64::from(other.max[h] - max).exp();
            self.max[h] = max;
        }
    }

    /// The share of head `h`'s normalizer one of its merged scores holds (its sink's excluded).
    pub fn share_of(&self, h: usize, score: f32) -> f64 {
        match self.sum[h] > 0.0 {
            true => f64::from(score * self.scale - self.max[h]).exp() / self.sum[h],
            false => 0.0,
        }
    }

    /// The share of head `h`'s normalizer that `scores` (a subset of those merged) and its sink
    /// hold.
    pub fn share(&self, h: usize, scores: impl Iterator<Item = f32>) -> f64 {
        let sink = f64::from(self.sink[h] - self.max[h]).exp();
        let part: f64 = sink + scores.map(|s| f64::from(s * self.scale - self.max[h]).exp()).sum::<f64>();
        if self.sum[h] > 0.0 {
            part / self.sum[h]
        } else {
            1.0
        }
    }
}

/// What the host merges a layer's score blocks into: each head's top-k and, when the fidelity
/// guard is on, its attention mass. Merges of disjoint sets of blocks combine into the merge of
/// all of them, so blocks can be merged on several threads at once.
pub struct BlockMerge {
    pub top: HeadsTopK,
    pub mass: Option<HeadsMass>,
}

impl BlockMerge {
    pub fn new(top: HeadsTopK, mass: Option<HeadsMass>) -> Self {
        Self { top, mass }
    }

    pub fn merge(&mut self, block: &ScoreBlock) {
        self.top.merge(block);
        if let Some(mass) = &mut self.mass {
            mass.merge(block);
        }
    }

    pub fn absorb(&mut self, other: BlockMerge) {
        self.top.absorb(other.top);
        if let (Some(mass), Some(other)) = (&mut self.mass, other.mass) {
            mass.absorb(other);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_keys_order_like_scores_then_tokens() {
        let pairs = [
            (f32::NAN, 1),
            (f32::NEG_INFINITY, 0),
            (-3.5, 7),
            (-3.5, 2),
            (-0.0, 4),
            (0.0, 3),
            (1e-30, 9),
            (2.0, 5),
            (f32::INFINITY, 6),
        ];
        let keys: Vec<u64> = pairs.iter().map(|&(s, t)| rank_key(s, t)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
        for &(s, t) in &pairs[1..] {
            assert_eq!(unrank_key(rank_key(s, t)), (s, t));
        }
        assert_eq!(unrank_key(rank_key(f32::NAN, 3)), (f32::NEG_INFINITY, 3));
    }

    #[test]
    fn mass_shares_match_a_plain_softmax() {
        let tokens: Vec<u32> = (0..100).collect();
        let scores: Vec<f32> = (0..100).map(|i| ((i * 37) % 101) as f32 / 10.0).collect();
        let mut mass = HeadsMass::new(1, 0.5);
        for (t, s) in tokens.chunks(30).zip(scores.chunks(30)) {
            mass.merge(&ScoreBlock { tokens: t.to_vec(), scores: s.to_vec(), produced: std::time::Instant::now() });
        }
        let z: f64 = scores.iter().map(|&s| f64::from(0.5 * s).exp()).sum();
        let want: f64 = scores[..10].iter().map(|&s| f64::from(0.5 * s).exp()).sum::<f64>() / z;
        assert!((mass.share(0, scores[..10].iter().copied()) - want).abs() < 1e-9);
        let mut top = TopK::new(3);
        top.merge(&tokens, &scores);
        let ranked = top.into_ranked();
        assert!(ranked[0].0 >= ranked[1].0 && ranked[1].0 >= ranked[2].0);
    }

    /// A sink is in the softmax's normalizer and always attended to: the share the selected
    /// scores and the sink hold together, whichever was seen first.
    #[test]
    fn a_sink_counts_in_the_mass_and_as_captured() {
        let scores: Vec<f32> = (0..50).map(|i| ((i * 13) % 17) as f32).collect();
        let block =
            ScoreBlock { tokens: (0..50).collect(), scores: scores.clone(), produced: std::time::Instant::now() };
        let z: f64 = scores.iter().map(|&s| f64::from(0.5 * s).exp()).sum();
        let selected: f64 = scores[..5].iter().map(|&s| f64::from(0.5 * s).exp()).sum();
        for sink in [-3.0f32, 4.0, 40.0] {
            let with_sink = f64::from(sink).exp();
            let want = (selected + with_sink) / (z + with_sink);
            let mut sink_last = HeadsMass::new(1, 0.5);
            sink_last.merge(&block);
            sink_last.add_sink(0, sink);
            let mut sink_first = HeadsMass::new(1, 0.5);
            sink_first.add_sink(0, sink);
            sink_first.merge(&block);
            for mass in [sink_last, sink_first] {
                let share = mass.share(0, scores[..5].iter().copied());
                assert!((share - want).abs() < 1e-9, "sink {sink}: {share} against {want}");
            }
        }
    }

    #[test]
    fn blocks_in_any_order_give_the_global_top_k() {
        let scores: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 1009) as f32).collect();
        let mut want: Vec<u32> = (0..1000u32).collect();
        want.sort_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]));
        let mut want = want[..50].to_vec();
        want.sort_unstable();
        let mut top = TopK::new(50);
        for (start, end) in [(700, 1000), (0, 256), (256, 512), (512, 700)] {
            top.merge(&(start as u32..end as u32).collect::<Vec<_>>(), &scores[start..end]);
        }
        assert_eq!(top.into_tokens(), want);
    }

    #[test]
    fn merges_of_parts_combine_into_the_merge_of_the_whole() {
        let tokens: Vec<u32> = (0..3000).collect();
        let scores: Vec<f32> = (0..2 * 3000).map(|i| ((i * 7919) % 1013) as f32 / 100.0).collect();
        let block = |range: std::ops::Range<usize>| {
            let heads: Vec<f32> = (0..2).flat_map(|h| scores[h * 3000..][range.clone()].iter().copied()).collect();
            ScoreBlock { tokens: tokens[range].to_vec(), scores: heads, produced: std::time::Instant::now() }
        };
        let new = || BlockMerge::new(HeadsTopK::new(2, 300), Some(HeadsMass::new(2, 0.3)));
        let mut whole = new();
        whole.merge(&block(0..3000));
        let mut parts = [new(), new(), new()];
        for (i, start) in (0..3000).step_by(250).enumerate() {
            parts[i % 3].merge(&block(start..start + 250));
        }
        let [mut all, b, c] = parts;
        all.absorb(c);
        all.absorb(b);
        let (whole_mass, all_mass) = (whole.mass.unwrap(), all.mass.unwrap());
        for h in 0..2 {
            let share = |m: &HeadsMass| m.share(h, scores[h * 3000..][..100].iter().copied());
            assert!(
                (share(&whole_mass) - share(&all_mass)).abs() < 1e-9,
                "head {h}: {} vs {}",
                share(&whole_mass),
                share(&all_mass)
            );
        }
        assert_eq!(all.top.into_tokens(), whole.top.into_tokens());
    }

    #[test]
    fn token_sets_come_out_ascending_dense_or_sparse() {
        let dense: Vec<u32> = (0..500u32).map(|i| i * 7919 % 1000).collect();
        let mut want = dense.clone();
        want.sort_unstable();
        assert_eq!(ascending(dense), want);
        assert_eq!(ascending(vec![1_000_000, 3, 64, 63, 0]), vec![0, 3, 63, 64, 1_000_000]);
        assert_eq!(ascending(Vec::new()), Vec::<u32>::new());
    }

    #[test]
    fn ties_at_the_floor_go_to_the_lower_token_whatever_the_order() {
        // Scores in 0..5, so the top 60 are all ties at 4, and the blocks arrive high tokens
        // first: the floor set by the first cut must still let lower tokens with 4 in.
        let scores: Vec<f32> = (0..2000).map(|i| (i % 5) as f32).collect();
        let want: Vec<u32> = (0..2000u32).filter(|&t| t % 5 == 4).take(60).collect();
        let mut top = TopK::new(60);
        for start in (0..2000).step_by(100).rev() {
            top.merge(&(start as u32..start as u32 + 100).collect::<Vec<_>>(), &scores[start..start + 100]);
            assert!(top.kept.len() < 2 * SCORE_BLOCK_MIN + 100);
        }
        assert!(top.floor > 0, "the test must cut before the end");
        assert_eq!(top.into_tokens(), want);
    }
}
