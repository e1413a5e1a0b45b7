//! Trigger names: versioned, tagged by what they record, and ours only.

use super::*;

#[test]
fn names_change_with_what_they_record() {
    let t = CaptureTarget {
        resource: "users".into(),
        table: "users".into(),
        key: "id".into(),
    };
    let mut other = t.clone();
    other.key = "login".into();
    let a = t.trigger_names(Backend::MySql);
    assert_eq!(a.len(), 3);
    assert!(
        a[0].starts_with("bloomgate_v2_") && a[0].ends_with("_i"),
        "{a:?}"
    );
    assert_ne!(a, other.trigger_names(Backend::MySql));
    assert_eq!(t.trigger_names(Backend::Postgres).len(), 1);
    // MySQL's identifier limit is 64 characters.
    assert!(a.iter().all(|n| n.len() <= 64));
    for n in a.iter().chain(&t.trigger_names(Backend::Postgres)) {
        assert!(is_ours(n), "{n}");
        assert_eq!(version_of(n), Some(CAPTURE_VERSION));
    }
    assert_eq!(version_of("bloomgate_v12_0123abcd_i"), Some(12));
    for n in [
        "bloomgate_",
        "bloomgate_v1_0000000g_i",
        "bloomgate_v1_0123abcd_x",
        "bloomgate_v_0123abcd_i",
        "bloomgate_v1_0123ABCD_i",
        "bloomgate_v1_0123abcd_i\"; DROP TABLE users; --",
        "bloomgate_v1_0123abc",
        "users_audit",
    ] {
        assert!(!is_ours(n), "{n}");
    }
}
