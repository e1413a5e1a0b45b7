//! Many keys at once (`batch`): screened by the filter's batch call (and,
//! in strict or redis mode, the shared filter), then L1, then one load of
//! the rest through the SQL bulkhead. What is loaded is not written back
//! to the caches: a batch has no leases.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::FutureExt;

use crate::cache::{Cached, Entry};
use crate::error::AppError;
use crate::resource::reader::Rows;
use crate::resource::ShieldedReader;
use crate::shield::Verdict;
use crate::sql::StoreError;

/// One key's answer in a batch: its row, or `None` for no row.
pub type BatchRow<T> = Option<Arc<Cached<T>>>;

impl<R: Rows> ShieldedReader<R> {
    /// The answers for `keys`, in their order. `load` reads the keys that
    /// passed the filter and missed L1 (one statement, ideally), holding a
    /// bulkhead slot.
    ///
    /// # Errors
    /// [`AppError::Overloaded`] when the bulkhead is full;
    /// [`AppError::Unavailable`] when `load` fails.
    pub async fn batch<F, Fut>(
        &self,
        keys: &[R::Key],
        load: F,
    ) -> Result<Vec<BatchRow<R::Row>>, AppError>
    where
        F: FnOnce(Vec<R::Key>) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<(R::Key, R::Row)>, StoreError>>,
    {
        let verdicts = self.verdicts(keys).await;
        // Where a row's key may be loose, L1 does not answer (see
        // `Fold`): every key that passed is loaded.
        let l1_answers = !self.loose_rows().await;
        let mut answers: Vec<Option<BatchRow<R::Row>>> = vec![None; keys.len()];
        let (mut to_load, mut negative) = (Vec::new(), Vec::new());
        for (i, (k, v)) in keys.iter().zip(&verdicts).enumerate() {
            if *v == Verdict::Reject {
                self.audit_refusal(k);
                answers[i] = Some(None);
                continue;
            }
            if !l1_answers || !R::judged(k) {
                to_load.push(i);
                continue;
            }
            match self.l1.get(k) {
                Some(Entry::Found(row)) => answers[i] = Some(Some(row)),
                Some(Entry::Missing) => negative.push(i),
                None => to_load.push(i),
            }
        }
        // L1's "not found"s: in strict and redis modes only where the
        // shared filter agrees (see `trusts_l1`), asked once for them all;
        // in redis mode it said "maybe" already.
        let trusted = match (self.shared(), self.shield.enabled(), negative.is_empty()) {
            (Some(_), true, false) if self.mode.shared_only() => vec![false; negative.len()],
            (Some(shared), true, false) => {
                let asked: Vec<R::Key> = negative.iter().map(|&i| keys[i].clone()).collect();
                shared
                    .maybe_contains_many(&asked)
                    .await
                    .into_iter()
                    .map(|maybe| !maybe)
                    .collect()
            }
            _ => vec![true; negative.len()],
        };
        for (&i, trust) in negative.iter().zip(trusted) {
            if trust {
                answers[i] = Some(None);
            } else {
                to_load.push(i);
            }
        }
        to_load.sort_unstable();
        if !to_load.is_empty() {
            let wanted: Vec<R::Key> = to_load.iter().map(|&i| keys[i].clone()).collect();
            let loaded = {
                let Some(_slot) = self.bulkhead.slot().await else {
                    return Err(AppError::Overloaded);
                };
                // A source that panics answers 503, as a single read's does.
                std::panic::AssertUnwindSafe(load(wanted))
                    .catch_unwind()
                    .await
                    .map_err(|_| AppError::Unavailable("the source panicked".into()))?
                    .map_err(|e| AppError::Unavailable(e.to_string()))?
            };
            let rows: HashMap<R::Key, R::Row> = loaded.into_iter().collect();
            for &i in &to_load {
                // A key asked twice gets its row twice.
                let row = rows.get(&keys[i]).cloned();
                if row.is_none() && verdicts[i] == Verdict::Pass {
                    self.shield.note_passed_missing();
                }
                answers[i] = Some(row.map(Cached::new));
            }
        }
        Ok(answers.into_iter().map(Option::flatten).collect())
    }
}
