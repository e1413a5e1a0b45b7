//! Prints how much of a large filter's memory is backed by huge pages.
use bloomgate_filter::{BlockedBloom, Filter};
fn main() {
    let mut f = BlockedBloom::with_fpr(100_000_000, 0.01).unwrap();
    for i in 0..100_000_000u64 {
        f.insert(&i);
    }
    let smaps = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    for l in smaps
        .lines()
        .filter(|l| l.contains("AnonHuge") || l.starts_with("Rss"))
    {
        println!("{l}");
    }
    println!("filter bytes {}", f.bytes());
}
