//! What a decode step attends beyond its best tokens one by one, given that the cold pool is
//! read a page at a time.
//!
//! Free riders: the step selects its top α token by token, and also attends the tokens ranked
//! just below it (within twice the budget) whose rows it holds anyway, in a page it reads or in
//! memory: more of the attention, for no more I/O.
//!
//! Page-wise selection (after Quest, Tang et al. 2024, and ClusterKV): the budget buys whole
//! cold-pool pages rather than single tokens.
//!
//! Selected one by one, a head's top α lies in far more pages than α of them (at 8K, ~257 pages
//! of 16 tokens for 1,638 tokens), and each is read for one or two tokens. Here the ranked
//! tokens vote for their pages with their estimated attention, the pages holding the most are
//! taken whole until the budget is filled, and attention is exact over every token in them:
//! the tokens that came along with a page (the "free riders") are attended too, so nothing read
//! is wasted, and a step reads about budget / 16 pages per head (a few more where pages hold
//! sinks or recent tokens, which are attended anyway). With pages placed by key similarity, a
//! page's tokens score alike, so the pages that hold the best tokens hold few poor ones. The
//! ranked tokens outside those pages whose rows are in memory are attended too ("hot riders"),
//! at no I/O cost in that step; they keep their rows hot, so a run reads somewhat more. Why
//! whole pages are not the default: docs/decisions/token-wise-selection-stays-the-default.md.

use crate::kernels::ops::exp_shifted;
use crate::kernels::parallel::map_items;
use crate::kv::cold::GROUP_TOKENS;
use crate::score::topk::ascending;

/// A set of tokens as a bitmap, for membership tests by the thousand.
struct TokenSet(Vec<u64>);

impl TokenSet {
    fn new(tokens: &[u32]) -> Self {
        let mut bits = vec![0u64; tokens.iter().map(|&t| t as usize / 64 + 1).max().unwrap_or(0)];
        tokens.iter().for_each(|&t| bits[t as usize / 64] |= 1 << (t % 64));
        Self(bits)
    }

    fn contains(&self, t: u32) -> bool {
        self.0.get(t as usize / 64).is_some_and(|w| w & (1 << (t % 64)) != 0)
    }
}

/// Each head's free riders, best first, as many for every head (a layer's heads attend to
/// equally many tokens): of `ranked[head]`'s (score, token) pairs past the first `take`, those
/// whose rows are `held(head, token)` — in memory, or in one of the pages `page_of(head, ·)`
/// gives the selected tokens that `held` does not (the pages the step reads).
pub(super) fn free_riders(
    ranked: &[Vec<(f32, u32)>],
    take: usize,
    held: impl Fn(usize, u32) -> bool,
    page_of: impl Fn(usize, u32) -> usize,
) -> Vec<Vec<u32>> {
    let mut riders: Vec<Vec<u32>> = ranked
        .iter()
        .enumerate()
        .map(|(head, ranked)| {
            let (chosen, below) = ranked.split_at(take.min(ranked.len()));
            let mut read: Vec<usize> = chosen.iter().filter(|r| !held(head, r.1)).map(|r| page_of(head, r.1)).collect();
            read.sort_unstable();
            read.dedup();
            below
                .iter()
                .filter(|r| held(head, r.1) || read.binary_search(&page_of(head, r.1)).is_ok())
                .map(|r| r.1)
                .collect()
        })
        .collect();
    let fewest = riders.iter().map(Vec::len).min().unwrap_or(0);
    riders.iter_mut().for_each(|r| r.truncate(fewest));
    riders
}

/// Each head's ranked tokens (`ranked`: (score, token) pairs in any order) that `chosen`
/// (ascending, per head) left out but whose rows are `held(head, token)` in memory, as many for
/// every head, the best where a head has more: attended for no I/O.
/// (The heads are filtered, and cut, on the compute threads.)
pub(super) fn hot_riders(
    ranked: &[Vec<(f32, u32)>],
    chosen: &[Vec<u32>],
    held: impl Fn(usize, u32) -> bool + Sync,
) -> Vec<Vec<u32>> {
    let riders: Vec<Vec<(f32, u32)>> =
        map_items(ranked.iter().zip(chosen).enumerate().collect(), |(head, (ranked, chosen))| {
            let chosen = TokenSet::new(chosen);
            ranked.iter().filter(|r| !chosen.contains(r.1) && held(head, r.1)).copied().collect()
        });
    let fewest = riders.iter().map(Vec::len).min().unwrap_or(0);
    map_items(riders, |mut r| {
        if r.len() > fewest {
            r.select_nth_unstable_by(fewest, best_first);
            r.truncate(fewest);
        }
        r.iter().map(|r| r.1).collect()
    })
}

/// The ranking's order: higher score first, then the lower token.
fn best_first(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// One head's `take` candidate tokens (ascending), as whole pages.
///
/// `ranked` holds the head's best (score, token) pairs in any order, at least `take` of them
/// (given fewer, it takes that many); scores are weighted as attention by
/// `exp(scale · (score − best))`. `page_of` gives a token's page, `members` a page's tokens, of
/// which only those `is_candidate` accepts are taken (the sinks and recent tokens are attended
/// anyway, and a page may run past the cache's end). The last page taken is cut to fit: its
/// ranked tokens first, best first, then the rest.
pub(super) fn whole_pages(
    ranked: &[(f32, u32)],
    take: usize,
    scale: f32,
    page_of: impl Fn(u32) -> usize,
    members: impl Fn(usize) -> [u32; GROUP_TOKENS],
    is_candidate: impl Fn(u32) -> bool,
) -> Vec<u32> {
    let take = take.min(ranked.len());
    let Some(best) = ranked.iter().map(|r| r.0).reduce(f32::max) else { return Vec::new() };
    // The attention of each page's ranked tokens, summed per page (a step ranks thousands of
    // tokens per head and layer: no sort, and a fast exp). Summed in fixed point, every token
    // at least one unit, so that the sums, and the pages' order, do not depend on the order the
    // pairs come in.
    let mut attention: Vec<f32> = ranked.iter().map(|r| scale * r.0).collect();
    exp_shifted(&mut attention, scale * best);
    let mut weights: Vec<u64> = Vec::new();
    for (&(_, t), &a) in ranked.iter().zip(&attention) {
        let page = page_of(t);
        if page >= weights.len() {
            weights.resize(page + 1 + page / 4, 0);
        }
        weights[page] += ((a * VOTE_UNIT) as u64).max(1);
    }
    let mut pages: Vec<(usize, u64)> =
        weights.iter().enumerate().filter(|w| *w.1 > 0).map(|(page, &w)| (page, w)).collect();
    pages.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut chosen: Vec<u32> = Vec::with_capacity(take + GROUP_TOKENS);
    for &(page, _) in &pages {
        let before = chosen.len();
        chosen.extend(members(page).into_iter().filter(|&t| is_candidate(t)));
        if chosen.len() >= take {
            // Every ranked token is a candidate in one of these pages, so the budget fills.
            let mut page_ranked: Vec<(f32, u32)> = ranked.iter().filter(|r| page_of(r.1) == page).copied().collect();
            page_ranked.sort_unstable_by(best_first);
            chosen[before..].sort_by_key(|&t| page_ranked.iter().position(|r| r.1 == t).unwrap_or(usize::MAX));
            chosen.truncate(take);
            break;
        }
    }
    ascending(chosen)
}

/// A vote of weight 1 in [`whole_pages`]' fixed point.
const VOTE_UNIT: f32 = (1u64 << 32) as f32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_riders_are_the_ranked_tokens_below_the_budget_held_anyway_as_many_per_head() {
        // Pages of 16 tokens, a budget of 2; tokens 20 and 40 are hot in head 0. Head 0 selects
        // 35 (cold: page 2 is read) and 40 (hot); head 1 selects 1 and 2 (page 0 is read).
        let ranked = vec![
            vec![(9.0, 35), (8.0, 40), (7.0, 70), (6.0, 20), (5.0, 33), (4.0, 3)],
            vec![(9.0, 1), (8.0, 2), (7.0, 3), (6.0, 17), (5.0, 4)],
        ];
        let hot = |head: usize, t: u32| head == 0 && (t == 20 || t == 40);
        let riders = free_riders(&ranked, 2, hot, |_, t| t as usize / 16);
        // Head 0: 70 (page 4) and 3 (page 0) are not held; 20 is hot, 33 is in page 2. Head 1:
        // 3 and 4 are in page 0, 17 (page 1) is not. Both heads keep as many as the fewest: two.
        assert_eq!(riders, vec![vec![20, 33], vec![3, 4]]);
        assert_eq!(free_riders(&ranked, 10, hot, |_, t| t as usize / 16), vec![Vec::<u32>::new(); 2]);
    }

    #[test]
    fn hot_riders_are_the_ranked_tokens_left_out_but_in_memory_as_many_per_head() {
        // Head 0 chose 5 and 6; of its other ranked tokens 40 and 41 are hot, 90 is not. Head 1
        // chose 7; 50 is hot, and 7 itself (hot) is not counted twice.
        let ranked =
            vec![vec![(9.0, 5), (8.0, 41), (7.0, 90), (6.0, 40), (5.0, 6)], vec![(9.0, 7), (8.0, 50), (7.0, 51)]];
        let chosen = vec![vec![5, 6], vec![7]];
        let hot = |head: usize, t: u32| [40, 41, 50, 7].contains(&t) && (head == 1) == (t >= 50 || t == 7);
        // Head 0 would take 41 and 40, head 1 only 50: both keep one, the best.
        assert_eq!(hot_riders(&ranked, &chosen, hot), vec![vec![41], vec![50]]);
        assert_eq!(hot_riders(&ranked, &chosen, |_, _| false), vec![Vec::<u32>::new(); 2]);
    }

    #[test]
    fn pages_and_hot_riders_do_not_depend_on_the_order_the_ranking_comes_in() {
        // Score blocks arrive in no fixed order, so neither may the ranked pairs: 300 tokens
        // with many tied scores, given sorted, reversed and interleaved.
        let ranked: Vec<(f32, u32)> = (0..300u32).map(|t| (((t * 7919) % 37) as f32 / 4.0, t * 3 % 1000)).collect();
        let page_of = |t: u32| (t as usize * 13) % 61;
        let members =
            |page: usize| std::array::from_fn(|i| (0..1000u32).filter(|&t| page_of(t) == page).nth(i).unwrap_or(999));
        let orders = [
            ranked.clone(),
            ranked.iter().rev().copied().collect(),
            ranked.iter().step_by(2).chain(ranked.iter().skip(1).step_by(2)).copied().collect(),
        ];
        let chosen: Vec<Vec<u32>> =
            orders.iter().map(|r| whole_pages(r, 120, 0.7, page_of, members, |t| t != 999)).collect();
        assert_eq!(chosen[0].len(), 120);
        assert!(chosen.iter().all(|c| *c == chosen[0]));
        let held = |head: usize, t: u32| (t + head as u32).is_multiple_of(3);
        let riders: Vec<Vec<Vec<u32>>> = orders
            .iter()
            .map(|r| hot_riders(&[r.clone(), r.clone()], &[chosen[0].clone(), Vec::new()], held))
            .collect();
        let sorted = |mut r: Vec<Vec<u32>>| {
            r.iter_mut().for_each(|h| h.sort_unstable());
            r
        };
        assert!(riders.iter().all(|r| sorted(r.clone()) == sorted(riders[0].clone())));
    }

    /// Pages of 16 consecutive tokens.
    fn members(page: usize) -> [u32; GROUP_TOKENS] {
        std::array::from_fn(|i| (page * GROUP_TOKENS + i) as u32)
    }

    #[test]
    fn the_budget_buys_the_pages_holding_the_most_attention() {
        // Page 5 holds the single best token; page 2 holds eight nearly as good: together they
        // carry more attention, so page 2 comes first. The budget is 20 tokens: page 2 whole,
        // then page 5 cut to its best token and the three lowest others.
        let mut ranked: Vec<(f32, u32)> = vec![(10.0, 85)];
        ranked.extend((32..40).map(|t| (9.5, t)));
        ranked.extend((400..420).map(|t| (0.0, t))); // ranked below the budget
        let chosen = whole_pages(&ranked, 20, 1.0, |t| t as usize / GROUP_TOKENS, members, |_| true);
        let mut want: Vec<u32> = (32..48).collect();
        want.extend([80, 81, 82, 85]);
        assert_eq!(chosen, want);
    }

    #[test]
    fn tokens_outside_the_candidates_are_left_out_and_the_budget_still_fills() {
        // Tokens 0..4 are sinks and 56.. are past the candidates: the best page, 3, gives only
        // 48..56, so the budget of 14 reaches into page 0, which gives its ranked tokens and
        // the first others after its sinks.
        let mut ranked: Vec<(f32, u32)> = vec![(6.0, 50), (6.0, 51), (5.0, 5), (5.0, 6)];
        ranked.extend((20..30).map(|t| (1.0, t)));
        let chosen = whole_pages(&ranked, 14, 1.0, |t| t as usize / GROUP_TOKENS, members, |t| (4..56).contains(&t));
        assert_eq!(chosen, (4..10).chain(48..56).collect::<Vec<u32>>());
    }

    #[test]
    fn pages_follow_the_placement_not_the_text() {
        // Two pages of interleaved tokens: page 0 holds the even tokens, page 1 the odd ones.
        let members = |page: usize| std::array::from_fn(|i| (2 * i + page) as u32);
        let mut ranked: Vec<(f32, u32)> = vec![(3.0, 7), (2.9, 9)];
        ranked.extend((0..16).map(|i| (1.0, 2 * i)));
        let chosen = whole_pages(&ranked, 16, 4.0, |t| t as usize % 2, members, |_| true);
        assert_eq!(chosen, (0..16).map(|i| 2 * i + 1).collect::<Vec<u32>>());
    }
}
