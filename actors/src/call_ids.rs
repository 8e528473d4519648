//! Canonical call ids: every call id in a session's chat contexts is unique, derived ones
//! (`{id}/update_n`, `{id}/finished`) included, whatever ids the model sends.
//!
//! Providers reuse ids, and a model may send anything: an id it used before, an empty
//! one, one that looks like a derived id (`call_1/finished`) or like one of ours
//! (`call_1~2`). The rules:
//!
//! - `/` is the separator of derived ids, so a model's id never keeps one: each `/`
//!   becomes `_`. A canonical base id therefore never equals a derived id, and derived
//!   ids of distinct bases never meet.
//! - An empty id becomes `call`; an id longer than 64 bytes is cut to 64 (on a character
//!   boundary): ids name actors and travel in every request.
//! - An id already issued in the session becomes `{id}~{n}` with the smallest `n ≥ 2`
//!   not issued yet, found from a per-id counter: constant time per call however many
//!   calls share an id (an id the model sent literally as `x~2` is skipped over once).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The longest base id kept from the model.
const MAX_ID_BYTES: usize = 64;

/// The ids issued in one session, and the next suffix to try per repeated id.
#[derive(Debug, Default)]
pub(crate) struct CallIds {
    issued: HashSet<Arc<str>>,
    /// The issued ids in the order they were issued, for snapshots (which write only the
    /// ids issued since the last one).
    order: Vec<Arc<str>>,
    next_suffix: HashMap<Arc<str>, u32>,
}

impl CallIds {
    /// The canonical id for a call the model made with `provider_id`.
    pub(crate) fn canonical(&mut self, provider_id: &str) -> String {
        let mut end = provider_id.len().min(MAX_ID_BYTES);
        while !provider_id.is_char_boundary(end) {
            end -= 1;
        }
        let cut = &provider_id[..end];
        let base: Arc<str> = if cut.is_empty() {
            Arc::from("call")
        } else if cut.contains('/') {
            Arc::from(cut.replace('/', "_"))
        } else {
            Arc::from(cut)
        };
        if self.issued.insert(base.clone()) {
            self.order.push(base.clone());
            return base.to_string();
        }
        let next = self.next_suffix.entry(base.clone()).or_insert(2);
        loop {
            let candidate: Arc<str> = Arc::from(format!("{base}~{next}"));
            *next += 1;
            if self.issued.insert(candidate.clone()) {
                self.order.push(candidate.clone());
                return candidate.to_string();
            }
        }
    }

    /// How many ids were issued or reserved.
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }

    /// The ids issued or reserved after the first `from`, in order.
    pub(crate) fn since(&self, from: usize) -> Vec<String> {
        self.order
            .get(from..)
            .unwrap_or_default()
            .iter()
            .map(|id| id.to_string())
            .collect()
    }

    /// Marks an id that came from outside (a chat context given to an agent) as issued.
    /// Of a derived id (`x/finished`) its base is reserved: the derived ids of a later `x`
    /// would equal it.
    pub(crate) fn reserve(&mut self, id: &str) {
        let base: Arc<str> = Arc::from(id.split('/').next().unwrap_or(id));
        if self.issued.insert(base.clone()) {
            self.order.push(base);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_ids_get_suffixes_in_order() {
        let mut ids = CallIds::default();
        assert_eq!(ids.canonical("call_1"), "call_1");
        assert_eq!(ids.canonical("call_1"), "call_1~2");
        assert_eq!(ids.canonical("call_1"), "call_1~3");
        assert_eq!(ids.canonical("call_2"), "call_2");
    }

    #[test]
    fn an_id_that_looks_like_ours_is_skipped_over() {
        let mut ids = CallIds::default();
        assert_eq!(ids.canonical("x~2"), "x~2");
        assert_eq!(ids.canonical("x"), "x");
        assert_eq!(ids.canonical("x"), "x~3");
        assert_eq!(ids.canonical("x~2"), "x~2~2");
    }

    #[test]
    fn a_reserved_id_and_the_base_of_a_reserved_derived_id_are_not_issued_again() {
        let mut ids = CallIds::default();
        ids.reserve("call_1");
        ids.reserve("call_7/finished");
        assert_eq!(ids.canonical("call_1"), "call_1~2");
        assert_eq!(ids.canonical("call_7"), "call_7~2");
        assert_eq!(ids.canonical("call_2"), "call_2");
    }

    #[test]
    fn a_model_id_never_equals_a_derived_id() {
        let mut ids = CallIds::default();
        assert_eq!(ids.canonical("call_1"), "call_1");
        let sneaky = ids.canonical("call_1/finished");
        assert_eq!(sneaky, "call_1_finished");
        assert!(!sneaky.contains('/'));
        assert_eq!(ids.canonical(""), "call");
        assert_eq!(ids.canonical(""), "call~2");
    }

    #[test]
    fn a_huge_id_is_cut_and_still_unique() {
        let mut ids = CallIds::default();
        let huge = "é".repeat(10_000);
        let first = ids.canonical(&huge);
        assert!(first.len() <= MAX_ID_BYTES);
        assert!(first.chars().all(|c| c == 'é'));
        assert_ne!(ids.canonical(&huge), first);
    }

    #[test]
    fn thousands_of_calls_sharing_an_id_are_all_distinct() {
        let mut ids = CallIds::default();
        let all: HashSet<String> = (0..4_000).map(|_| ids.canonical("same")).collect();
        assert_eq!(all.len(), 4_000);
    }
}
