//! splitmix64: test data that is the same on every run and depends on no crate's random number
//! generator (candle's CPU `Tensor::rand` cannot be seeded).

pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `-max..=max`.
    pub fn level(&mut self, max: i64) -> i64 {
        (self.next() % (2 * max as u64 + 1)) as i64 - max
    }

    /// Uniform in `lo..hi`, from the top 24 bits.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}
