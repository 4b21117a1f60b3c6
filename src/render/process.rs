//! Running a renderer: a child process with a deadline and a cap on what it
//! may print, so a chart that loops or explodes delays and costs only its app.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Most of a renderer's stderr kept for its error message.
const MAX_STDERR_BYTES: u64 = 64 * 1024;
/// How often a running renderer is looked at.
const POLL: Duration = Duration::from_millis(10);

#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    /// The program could not be started.
    Spawn(String),
    /// Still running at the deadline; it was killed.
    TimedOut(Duration),
    /// Printed more than the cap; it was killed.
    TooLarge(u64),
    /// Exited with an error; its stderr.
    Exited(String),
}

/// Runs `command` to completion and returns its stdout.
pub fn run(mut command: Command, timeout: Duration, max_output: u64) -> Result<Vec<u8>, Failure> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|e| Failure::Spawn(e.to_string()))?;
    let overflow = Arc::new(AtomicBool::new(false));
    let stdout = child.stdout.take().map(|pipe| {
        let overflow = overflow.clone();
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let read = pipe.take(max_output + 1).read_to_end(&mut out);
            if out.len() as u64 > max_output {
                overflow.store(true, Ordering::Relaxed);
            }
            read.map(|_| out)
        })
    });
    let stderr = child.stderr.take().map(|pipe| {
        std::thread::spawn(move || {
            let mut err = Vec::new();
            let mut pipe = pipe;
            let _ = (&mut pipe).take(MAX_STDERR_BYTES).read_to_end(&mut err);
            // Drain the rest so the child never blocks on a full pipe.
            let _ = std::io::copy(&mut pipe, &mut std::io::sink());
            err
        })
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if overflow.load(Ordering::Relaxed) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Failure::TooLarge(max_output));
        }
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Failure::TimedOut(timeout));
            }
            Ok(None) => std::thread::sleep(POLL),
            Err(e) => return Err(Failure::Spawn(e.to_string())),
        }
    };
    let out = stdout.map(|t| t.join().ok().and_then(|r| r.ok()).unwrap_or_default());
    let err = stderr.map(|t| t.join().unwrap_or_default()).unwrap_or_default();
    if overflow.load(Ordering::Relaxed) {
        return Err(Failure::TooLarge(max_output));
    }
    if !status.success() {
        let message = String::from_utf8_lossy(&err).trim().to_string();
        return Err(Failure::Exited(if message.is_empty() {
            format!("exited with {status}")
        } else {
            message
        }));
    }
    Ok(out.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        command
    }

    #[test]
    fn output_comes_back_and_errors_carry_stderr() {
        assert_eq!(run(shell("echo hi"), Duration::from_secs(5), 100), Ok(b"hi\n".to_vec()));
        assert_eq!(
            run(shell("echo broken >&2; exit 3"), Duration::from_secs(5), 100),
            Err(Failure::Exited("broken".into()))
        );
    }

    #[test]
    fn a_program_past_its_deadline_is_killed() {
        let started = Instant::now();
        let result = run(shell("exec sleep 30"), Duration::from_millis(200), 100);
        assert_eq!(result, Err(Failure::TimedOut(Duration::from_millis(200))));
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_program_printing_past_the_cap_is_killed() {
        let result = run(shell("exec yes"), Duration::from_secs(20), 10_000);
        assert_eq!(result, Err(Failure::TooLarge(10_000)));
    }
}
