//! Webhook bodies and signature headers from anyone on the network.
#![no_main]

use gitcanary::source::webhook::{PushEvent, signature_is_valid};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(push) = PushEvent::parse(data) {
        let _ = push.is_for_branch("main");
    }
    let header = String::from_utf8_lossy(data);
    let _ = signature_is_valid(b"secret", data, Some(&header));
});
