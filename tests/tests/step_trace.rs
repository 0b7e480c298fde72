//! `HILLSIDE_TRACE=step` on the real model and a tiered store: a decode step reports the
//! store's phases, each inside the phase that holds it, and tracing changes no logit. (A binary
//! of its own: the trace's totals are process-wide, and another test's passes would add to them.)

mod common;

use hillside_engine::kv::{KvConfig, StoreKind};
use hillside_engine::trace::{self, Phase};
use hillside_engine::{Engine, Logits};

#[test]
fn a_traced_tiered_step_reports_every_phase_inside_its_parent_and_the_same_logits() {
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[20_000..40_000]).unwrap()[..700];
    let dir = common::Scratch::new("step-trace");
    let tiered =
        KvConfig { store: StoreKind::Tiered, cold_dir: dir.to_path_buf(), spare_copy: false, ..KvConfig::default() };
    let mut runs = Vec::new();
    for traced in [false, true] {
        let mut seq = engine.new_sequence_with(&tiered, Some(1024)).unwrap();
        engine.model().forward(&tokens[..600], seq.kv.as_mut(), Logits::Last).unwrap();
        trace::set_enabled(traced);
        trace::take();
        let logits: Vec<Vec<f32>> = tokens[600..608]
            .iter()
            .map(|&t| engine.model().forward(&[t], seq.kv.as_mut(), Logits::Last).unwrap())
            .collect();
        trace::set_enabled(false);
        runs.push((logits, trace::take()));
    }
    let (plain, traced) = (&runs[0], &runs[1]);
    assert_eq!(plain.0, traced.0, "tracing changes no logit");
    assert!(plain.1.is_empty(), "nothing is timed while tracing is off: {:?}", plain.1);
    let totals = &traced.1;
    let ns = |phase: Phase| totals.iter().find(|t| t.phase == phase).map(|t| t.ns);
    // Eight steps of a tiered store rank, read and rebalance, all inside the forward pass.
    for phase in [
        Phase::Forward,
        Phase::Prepare,
        Phase::RankScore,
        Phase::Gather,
        Phase::CopyResident,
        Phase::Attention,
        Phase::Commit,
        Phase::Rebalance,
    ] {
        assert!(ns(phase).is_some_and(|ns| ns > 0), "{phase:?} was not timed: {totals:?}");
    }
    assert_eq!(totals.iter().find(|t| t.phase == Phase::Forward).unwrap().calls, 8);
    for parent in Phase::ALL {
        let children: u64 = totals.iter().filter(|t| t.phase.parent() == Some(parent)).map(|t| t.ns).sum();
        assert!(children <= ns(parent).unwrap_or(0), "{parent:?}'s phases add up to more than it: {totals:?}");
    }
}
