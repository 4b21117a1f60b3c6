//! Manifests from any commit: parsed, located by file and line, validated.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let set = gitcanary::manifest::load_files([("app/fuzz.yaml".to_string(), data.to_vec())].into_iter());
    for app in set.apps.values() {
        for problem in gitcanary::rollout::validate::problems(app, "default") {
            let _ = problem.to_string();
        }
        for manifest in app.manifests.iter() {
            let _ = manifest.location();
        }
    }
});
