//! Moving a whole filter: [`RedisBloom::upload`] merges a local filter's
//! bits in, [`RedisBloom::download`] reads them back, and
//! [`RedisBloom::destroy`] deletes every key.

use bloomgate_filter::{BlockedBloom, Filter};
use redis::AsyncCommands;

use crate::{Error, RedisBloom, Result, DOWNLOAD_CHUNK};

impl RedisBloom {
    fn check_shape(&self, local: &BlockedBloom) -> Result<()> {
        if local.params() != self.params || local.seed() != self.seed {
            return Err(Error::ShapeMismatch {
                key: self.key.clone(),
            });
        }
        Ok(())
    }

    /// Merges a local filter's bits (same shape and seed) into the shared
    /// ones with `BITOP OR`, segment by segment, e.g. after building from
    /// the database. A merge, not a replacement: a `SETBIT` another
    /// instance makes while the upload runs is kept (replacing the string
    /// would drop it, a false negative). Clearing bits (forgetting deleted
    /// keys) needs a fresh key.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`]; Redis errors.
    pub async fn upload(&self, local: &BlockedBloom) -> Result<()> {
        self.check_shape(local)?;
        let bytes: Vec<u8> = local
            .bitmap()
            .words()
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .map(u8::reverse_bits)
            .take((self.params.bits() / 8) as usize)
            .collect();
        for i in 0..self.segments() {
            let start = (i * self.segment_bytes) as usize;
            let part = &bytes[start..start + self.segment_len(i) as usize];
            let seg = self.segment_key(i);
            // The temporary key's hash tag is the segment's name, so a
            // cluster keeps both in one slot and the transaction runs.
            let tmp = format!("{{{seg}}}:upload:{:016x}", fastrand::u64(..));
            let _: () = redis::pipe()
                .atomic()
                .set(&tmp, part)
                .ignore()
                .cmd("BITOP")
                .arg("OR")
                .arg(&seg)
                .arg(&seg)
                .arg(&tmp)
                .ignore()
                .del(&tmp)
                .ignore()
                .query_async(&mut self.conn.clone())
                .await?;
        }
        Ok(())
    }

    /// Copies the shared bits into a local filter, reading each segment in
    /// `GETRANGE` chunks of 4 MiB.
    ///
    /// # Errors
    /// [`Error::Meta`] when a segment is missing or has the wrong length;
    /// Redis errors.
    pub async fn download(&self) -> Result<BlockedBloom> {
        let total = self.params.bits() / 8;
        let mut bytes = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        for i in 0..self.segments() {
            let len = self.segment_len(i);
            let seg = self.segment_key(i);
            let mut at = 0;
            while at < len {
                let end = (at + DOWNLOAD_CHUNK).min(len);
                let chunk: Vec<u8> = redis::cmd("GETRANGE")
                    .arg(&seg)
                    .arg(at)
                    .arg(end - 1)
                    .query_async(&mut self.conn.clone())
                    .await?;
                if chunk.len() as u64 != end - at {
                    return Err(Error::Meta {
                        key: seg,
                        reason: format!(
                            "segment missing or short: {} bytes at {at}, the shape needs {}",
                            chunk.len(),
                            end - at
                        ),
                    });
                }
                bytes.extend_from_slice(&chunk);
                at = end;
            }
        }
        let mut local = BlockedBloom::new(self.params, self.seed)?;
        let mut words: Vec<u64> = bytes
            .chunks(8)
            .map(|c| {
                let mut a = [0u8; 8];
                for (d, s) in a.iter_mut().zip(c) {
                    *d = s.reverse_bits();
                }
                u64::from_le_bytes(a)
            })
            .collect();
        words.resize(local.bitmap().words().len(), 0);
        local.set_words(&words)?;
        Ok(local)
    }

    /// Deletes the filter, its segments and its metadata (one key per
    /// command, so a cluster routes each).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn destroy(self) -> Result<()> {
        let mut c = self.conn.clone();
        for i in 0..self.segments() {
            let _: () = c.del(self.segment_key(i)).await?;
        }
        let _: () = c.del(format!("{}:meta", self.key)).await?;
        Ok(())
    }
}
