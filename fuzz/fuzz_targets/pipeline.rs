//! The whole offline pipeline on an arbitrary repository: load, validate,
//! plan each app, and walk each Rollout's release with its overlays. The
//! input is the repository's files, separated by NUL bytes, spread over
//! three apps. Any panic is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let files = data
        .split(|&b| b == 0)
        .enumerate()
        .map(|(i, content)| (format!("app{}/file{i}.yaml", i % 3), content.to_vec()));
    let mut set = gitcanary::manifest::load_files(files);
    let options = gitcanary::sync::SyncOptions::default();
    gitcanary::rollout::validate::validate(&mut set, &options.allowed);
    for problem in gitcanary::rollout::offline::plan_problems(&set, &options) {
        let _ = problem.to_string();
    }
});
