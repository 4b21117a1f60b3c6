//! Pull-request comments from anyone, and the analysis condition language.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = gitcanary::github::parse_command(&text);
    if let Ok(condition) = gitcanary::rollout::analysis::parse_condition(&text) {
        let _ = condition.judge(Some(1.0), Some(0.5));
    }
    let _ = gitcanary::rollout::analysis::query_problems(&text);
});
