//! A SKU read from exactly the JSON `serde_json` writes for it, without
//! serde's field matching: the Redis tier's values are the rows' own
//! encodings, and `perf` put serde's reading of them at about 4% of a
//! Redis hit's CPU. Anything else (fields in another order, spaces, a
//! name with an escape, a number serde would refuse) is `None`, and the
//! caller hands it to serde, so together they accept exactly what serde
//! accepts and read it the same (`tests` below check it with generated
//! SKUs and bytes).

use super::Sku;

/// `raw` as a SKU when it is the form `serde_json::to_vec` gives one;
/// `None` otherwise (serde decides then).
#[must_use]
pub fn canonical(raw: &[u8]) -> Option<Sku> {
    let mut r = Reader { b: raw, i: 0 };
    r.lit(b"{\"id\":")?;
    let id = r.int()?;
    r.lit(b",\"name\":\"")?;
    let name = r.plain_str()?;
    let mut n = [0; NUMBERS.len()];
    for (v, field) in n.iter_mut().zip(NUMBERS) {
        r.lit(field)?;
        *v = r.int()?;
    }
    r.lit(b"}")?;
    let [original_price, seckill_price, stock, seckill_start, seckill_end, updated_at] = n;
    (r.i == raw.len()).then_some(Sku {
        id,
        name,
        original_price,
        seckill_price,
        stock,
        seckill_start,
        seckill_end,
        updated_at,
    })
}

/// The integer fields after the name, in the order serde writes them.
const NUMBERS: [&[u8]; 6] = [
    b",\"original_price\":",
    b",\"seckill_price\":",
    b",\"stock\":",
    b",\"seckill_start\":",
    b",\"seckill_end\":",
    b",\"updated_at\":",
];

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    fn lit(&mut self, lit: &[u8]) -> Option<()> {
        self.b
            .get(self.i..)?
            .starts_with(lit)
            .then(|| self.i += lit.len())
    }

    /// An integer as serde reads one into an `i64`: an optional `-`, then
    /// `0` or digits not starting with `0`, within `i64`, and not `-0`.
    fn int(&mut self) -> Option<i64> {
        let negative = self.b.get(self.i) == Some(&b'-');
        if negative {
            self.i += 1;
        }
        let start = self.i;
        // Summed below zero, so `i64::MIN` fits.
        let mut v: i64 = 0;
        while let Some(&c) = self.b.get(self.i).filter(|c| c.is_ascii_digit()) {
            v = v.checked_mul(10)?.checked_sub(i64::from(c - b'0'))?;
            self.i += 1;
        }
        let digits = self.i - start;
        if digits == 0 || (digits > 1 && self.b[start] == b'0') {
            return None;
        }
        if negative {
            // serde reads `-0` as a float, which is no `i64`.
            (v != 0).then_some(v)
        } else {
            v.checked_neg()
        }
    }

    /// The rest of a string whose opening quote was read: UTF-8 without
    /// an escape or a control character, up to its closing quote.
    fn plain_str(&mut self) -> Option<String> {
        let rest = self.b.get(self.i..)?;
        let end = rest
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
        if rest[end] != b'"' {
            return None;
        }
        let s = std::str::from_utf8(&rest[..end]).ok()?;
        self.i += end + 1;
        Some(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sku() -> impl Strategy<Value = Sku> {
        (
            any::<i64>(),
            any::<String>(),
            prop::array::uniform6(any::<i64>()),
        )
            .prop_map(|(id, name, n)| Sku {
                id,
                name,
                original_price: n[0],
                seckill_price: n[1],
                stock: n[2],
                seckill_start: n[3],
                seckill_end: n[4],
                updated_at: n[5],
            })
    }

    fn serde(raw: &[u8]) -> Option<Sku> {
        serde_json::from_slice(raw).ok()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, rng_seed: proptest::test_runner::RngSeed::Fixed(44), ..ProptestConfig::default() })]

        /// Every SKU's own encoding is read back, unless its name holds
        /// an escape (then serde reads it).
        #[test]
        fn reads_every_encoding_serde_writes(s in sku()) {
            let raw = serde_json::to_vec(&s).unwrap();
            let escaped = serde_json::to_string(&s.name).unwrap().len() != s.name.len() + 2;
            match canonical(&raw) {
                Some(read) => prop_assert_eq!(read, s),
                None => prop_assert!(escaped, "refused {}", String::from_utf8_lossy(&raw)),
            }
        }

        /// Whatever it reads, serde reads the same: an encoding with one
        /// byte changed, cut short or lengthened.
        #[test]
        fn never_reads_what_serde_would_not(s in sku(), at in any::<prop::sample::Index>(), byte in any::<u8>(), how in 0..3u8) {
            let mut raw = serde_json::to_vec(&s).unwrap();
            let i = at.index(raw.len());
            match how {
                0 => raw[i] = byte,
                1 => raw.truncate(i),
                _ => raw.insert(i, byte),
            }
            if let Some(read) = canonical(&raw) {
                prop_assert_eq!(Some(read), serde(&raw), "{}", String::from_utf8_lossy(&raw));
            }
        }
    }

    #[test]
    fn leaves_what_it_does_not_know_to_serde() {
        let cases: &[&[u8]] = &[
            br#"{"id":01,"name":"a","original_price":1,"seckill_price":1,"stock":1,"seckill_start":1,"seckill_end":1,"updated_at":1}"#,
            br#"{"id":1,"name":"a","original_price":1,"seckill_price":1,"stock":1,"seckill_start":1,"seckill_end":1,"updated_at":9223372036854775808}"#,
            br#"{"id":1,"name":"a","original_price":1.0,"seckill_price":1,"stock":1,"seckill_start":1,"seckill_end":1,"updated_at":1}"#,
            br#"{"id":1,"name":"a","original_price":1,"seckill_price":1,"stock":1,"seckill_start":1,"seckill_end":1,"updated_at":1} "#,
            br#"{"id":1,"name":"a","original_price":1,"seckill_price":1,"stock":1,"seckill_start":1,"seckill_end":1,"updated_at":1,"x":1}"#,
            br#"{"id":1,"name":"a\"b","original_price":1,"seckill_price":1,"stock":1,"seckill_start":1,"seckill_end":1,"updated_at":1}"#,
            br#"{"id":-,"name":"a","original_price":1,"seckill_price":1,"stock":1,"seckill_start":1,"seckill_end":1,"updated_at":1}"#,
            b"{\"id\":1,\"name\":\"\xff\",\"original_price\":1,\"seckill_price\":1,\"stock\":1,\"seckill_start\":1,\"seckill_end\":1,\"updated_at\":1}",
        ];
        for raw in cases {
            assert_eq!(canonical(raw), None, "{}", String::from_utf8_lossy(raw));
        }
        let minus_zero = br#"{"id":-0,"name":"","original_price":0,"seckill_price":0,"stock":1,"seckill_start":1,"seckill_end":1,"updated_at":1}"#;
        assert_eq!((canonical(minus_zero), serde(minus_zero)), (None, None));
        let min = br#"{"id":-9223372036854775808,"name":"","original_price":0,"seckill_price":0,"stock":1,"seckill_start":1,"seckill_end":1,"updated_at":1}"#;
        assert_eq!(canonical(min), serde(min));
        assert_eq!(canonical(min).map(|s| s.id), Some(i64::MIN));
    }
}
