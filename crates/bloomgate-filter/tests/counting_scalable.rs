//! Counting saturation and removal rules; scalable growth and its compound rate.

mod common;

use bloomgate_filter::{CountingBloom, Error, Filter, ScalableBloom, ScalableOptions, SATURATED};
use common::{three_sigma, Rng};

#[test]
fn saturated_counters_never_decrement() {
    let mut f = CountingBloom::with_fpr(1000, 0.01).unwrap();
    for _ in 0..40 {
        f.insert(&9u64);
    }
    assert!(f.counters(&9u64).iter().all(|&c| u64::from(c) == SATURATED));
    // More removes than inserts would drain a wrapping counter; a saturated
    // one stays put, so the key can never become a false negative.
    for _ in 0..40 {
        f.remove(&9u64).unwrap();
    }
    assert!(f.contains(&9u64));
    assert!(f.counters(&9u64).iter().all(|&c| u64::from(c) == SATURATED));
}

#[test]
fn removing_an_absent_key_is_refused_and_changes_nothing() {
    let mut f = CountingBloom::with_fpr(1000, 0.001).unwrap();
    f.insert(&1u64);
    let before = f.clone();
    assert!(matches!(f.remove(&2u64), Err(Error::NotPresent)));
    assert_eq!(f, before);
}

#[test]
fn remove_then_absent_when_alone() {
    let mut f = CountingBloom::with_fpr(1000, 0.001).unwrap();
    f.insert(&5u64);
    f.insert(&5u64);
    f.remove(&5u64).unwrap();
    assert!(f.contains(&5u64));
    f.remove(&5u64).unwrap();
    assert!(!f.contains(&5u64));
    assert_eq!(f.count_ones(), 0);
}

#[test]
fn scalable_stays_under_target_at_fifty_times_capacity() {
    let initial = 10_000u64;
    let p = 0.01;
    let mut f = ScalableBloom::new(ScalableOptions::new(initial, p)).unwrap();
    let members = Rng(5000).keys((initial * 50) as usize);
    for k in &members {
        f.insert(k).unwrap();
    }
    assert!(members.iter().all(|k| f.contains(k)), "false negative");
    let chain = f.chain();
    assert!(chain.len() >= 5, "chain of {}", chain.len());
    assert!(chain
        .windows(2)
        .all(|w| w[1].capacity >= 2 * w[0].capacity - 1));
    assert!(chain.windows(2).all(|w| w[1].target_fpr < w[0].target_fpr));
    let trials = 2_000_000u64;
    let mut rng = Rng(5001);
    let hits = (0..trials).filter(|_| f.contains(&rng.next_u64())).count();
    let measured = hits as f64 / trials as f64;
    let expected = f.expected_fpr(0);
    eprintln!(
        "scalable: {} links, measured {measured}, expected {expected}",
        chain.len()
    );
    assert!(expected <= p);
    assert!(
        measured <= p + three_sigma(p, trials),
        "measured {measured} above {p}"
    );
    assert!(
        (measured - expected).abs() / expected <= 0.15,
        "measured {measured} expected {expected}"
    );
}

#[test]
fn scalable_rejects_bad_options() {
    let mut o = ScalableOptions::new(100, 0.01);
    o.growth = 1.0;
    assert!(ScalableBloom::new(o).is_err());
    let mut o = ScalableOptions::new(100, 0.01);
    o.tightening = 1.0;
    assert!(ScalableBloom::new(o).is_err());
    assert!(matches!(
        ScalableBloom::new(ScalableOptions::new(0, 0.01)),
        Err(Error::ZeroItems)
    ));
}
