//! Memories kept and dropped: by key, by `Host` and by change, and the
//! stamps in Redis an instance trusts.

use super::*;

fn memory() -> AbsentMemory<String> {
    AbsentMemory::new(100, Duration::from_secs(60), None, None)
}

#[tokio::test]
async fn a_404_is_recalled_until_its_key_changes() {
    let m = memory();
    let k = "u1".to_owned();
    let Recall::Unknown(t) = m.recall(&k, "h", true).await else {
        panic!("remembered before any 404");
    };
    m.remember(&k, "h", t).await;
    assert!(matches!(m.recall(&k, "h", true).await, Recall::Absent));
    m.forget_local(&k);
    assert!(matches!(m.recall(&k, "h", true).await, Recall::Unknown(_)));
    assert_eq!(m.counters().remembered.load(Ordering::Relaxed), 1);
    assert_eq!(m.counters().recalled.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_404_answers_only_the_host_it_was_asked_of() {
    let m = memory();
    let k = "u1".to_owned();
    let Recall::Unknown(t) = m.recall(&k, "evil.example", true).await else {
        panic!("remembered before any 404");
    };
    m.remember(&k, "evil.example", t).await;
    assert!(matches!(
        m.recall(&k, "evil.example", true).await,
        Recall::Absent
    ));
    assert!(
        matches!(m.recall(&k, "api.example", true).await, Recall::Unknown(_)),
        "a 404 of another virtual host refused the key here"
    );
}

/// Clients alternating between names of one API are each answered
/// once both 404s are kept; a change still drops them all, and at
/// most [`MAX_HOSTS`] are kept, the oldest going first.
#[tokio::test]
async fn a_404_is_kept_for_each_host_that_asked() {
    let m = memory();
    let k = "u1".to_owned();
    let ask = |host: &'static str| {
        let (m, k) = (m.clone(), k.clone());
        async move {
            match m.recall(&k, host, true).await {
                Recall::Absent => true,
                Recall::Unknown(t) => {
                    m.remember(&k, host, t).await;
                    false
                }
            }
        }
    };
    assert!(!ask("a.example").await && !ask("b.example").await);
    for _ in 0..3 {
        assert!(ask("a.example").await, "a's 404 was dropped by b's");
        assert!(ask("b.example").await);
    }
    m.forget_local(&k);
    assert!(!ask("a.example").await, "kept past a change of its key");
    assert!(!ask("b.example").await && ask("a.example").await);
    let hosts = ["c", "d", "e", "f", "g", "h", "i"]
        .map(|h| &*Box::leak(format!("{h}.example").into_boxed_str()));
    for h in hosts {
        assert!(!ask(h).await);
    }
    assert!(!ask("a.example").await, "more than MAX_HOSTS kept");
    assert!(ask("i.example").await && ask("c.example").await);
}

#[derive(Debug)]
struct At(i64, i64);

impl Positions for At {
    fn watermark(&self) -> i64 {
        self.1
    }
    fn since(&self) -> i64 {
        self.0
    }
}

#[test]
fn a_stamp_is_trusted_from_where_the_instance_follows_to_where_it_is() {
    let m: AbsentMemory<String> =
        AbsentMemory::new(10, Duration::from_secs(1), None, Some(Arc::new(At(10, 20))));
    let later = now_ms() + CLOCK_MARGIN_MS + 10;
    let at = |at: i64| Stamp {
        at,
        host: "h".into(),
        hosts: Vec::new(),
        t: later,
    };
    assert_eq!(
        m.trusted(&at(9)),
        Err(true),
        "made before this instance followed"
    );
    assert!(m.trusted(&at(10)).is_ok() && m.trusted(&at(20)).is_ok());
    assert_eq!(
        m.trusted(&at(21)),
        Err(false),
        "made past where this instance is"
    );
    // Forwarded before the instance started, or lost track since.
    let early = Stamp {
        at: 15,
        host: "h".into(),
        hosts: Vec::new(),
        t: now_ms().saturating_sub(5_000),
    };
    assert_eq!(m.trusted(&early), Err(true), "forwarded before the start");
    let fresh = Stamp { t: later, ..early };
    assert!(m.trusted(&fresh).is_ok());
    m.inner.lost_track.store(later, Ordering::Release);
    assert_eq!(
        m.trusted(&fresh),
        Err(true),
        "forwarded before the instance lost track"
    );
}

#[tokio::test]
async fn a_404_asked_for_before_a_change_is_not_stored_after_it() {
    let m = memory();
    let k = "u1".to_owned();
    let Recall::Unknown(t) = m.recall(&k, "h", true).await else {
        panic!("remembered before any 404");
    };
    // The create is applied while the request is at the upstream.
    m.forget_local(&k);
    m.remember(&k, "h", t).await;
    assert!(matches!(m.recall(&k, "h", true).await, Recall::Unknown(_)));
    assert_eq!(m.counters().refused.load(Ordering::Relaxed), 1);
    // And so for every key after a forget of them all.
    let Recall::Unknown(t) = m.recall(&k, "h", true).await else {
        unreachable!()
    };
    m.forget_all_local();
    m.remember(&k, "h", t).await;
    assert!(matches!(m.recall(&k, "h", true).await, Recall::Unknown(_)));
}
