//! Conditional requests: GitHub answers a `GET` whose `If-None-Match` names
//! the ETag it last gave with `304 Not Modified`, which it does not count
//! against the rate limit. The last answer of each URL is kept to stand in
//! for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;

/// URLs remembered at most; past that the oldest half is forgotten (a
/// forgotten URL costs one counted request, never a wrong answer).
const MAX_ENTRIES: usize = 512;

#[derive(Default)]
pub struct Etags {
    entries: Mutex<HashMap<String, Entry>>,
    /// Orders entries by when they were last stored.
    stored: std::sync::atomic::AtomicU64,
}

/// An answer GitHub gave: its body and headers.
pub type Answer = (Value, http::HeaderMap);

struct Entry {
    etag: String,
    answer: Arc<Answer>,
    stored: u64,
}

impl Etags {
    /// The ETag to send for `uri` and the answer a 304 to it stands for,
    /// if its answer is remembered (taken together, so that a 304 always
    /// finds the answer whose ETag was sent).
    pub fn remembered(&self, uri: &str) -> Option<(String, Arc<Answer>)> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.get(uri).map(|e| (e.etag.clone(), e.answer.clone()))
    }

    /// Remembers a 200 answer that carried an ETag.
    pub fn remember(&self, uri: &str, answer: &Answer) {
        let Some(etag) = answer.1.get(http::header::ETAG).and_then(|v| v.to_str().ok()) else {
            return;
        };
        let stored = self.stored.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= MAX_ENTRIES && !entries.contains_key(uri) {
            let mut ages: Vec<u64> = entries.values().map(|e| e.stored).collect();
            ages.sort_unstable();
            let median = ages[ages.len() / 2];
            entries.retain(|_, e| e.stored >= median);
        }
        entries.insert(
            uri.to_string(),
            Entry {
                etag: etag.to_string(),
                answer: Arc::new(answer.clone()),
                stored,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(etag: &str, n: u64) -> (Value, http::HeaderMap) {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::ETAG, etag.parse().unwrap());
        (serde_json::json!({"n": n}), headers)
    }

    #[test]
    fn an_answer_with_an_etag_stands_in_for_the_next_304_and_the_oldest_are_forgotten_first() {
        let etags = Etags::default();
        etags.remember("/a", &(Value::Null, http::HeaderMap::new()));
        assert!(etags.remembered("/a").is_none(), "no ETag, nothing remembered");
        etags.remember("/a", &answer("\"1\"", 1));
        let (etag, remembered) = etags.remembered("/a").unwrap();
        assert_eq!(etag, "\"1\"");
        assert_eq!(remembered.0, serde_json::json!({"n": 1}));
        for n in 0..MAX_ENTRIES as u64 {
            etags.remember(&format!("/{n}"), &answer("\"x\"", n));
        }
        let entries = etags.entries.lock().unwrap();
        assert!(entries.len() <= MAX_ENTRIES);
        assert!(!entries.contains_key("/a"), "the oldest went first");
        assert!(entries.contains_key(&format!("/{}", MAX_ENTRIES - 1)));
    }
}
