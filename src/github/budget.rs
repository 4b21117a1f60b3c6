//! GitHub's rate limit as the agent spends it: the waits GitHub asks for,
//! and the share of a token's budget left to the token's other users (pure
//! functions), and the client's quiet that follows from them.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl super::GitHub {
    pub(super) fn quiet(&self) -> Option<(Instant, String)> {
        let quiet = self.quiet_until.lock().unwrap_or_else(|e| e.into_inner()).clone();
        quiet.filter(|(until, _)| *until > Instant::now())
    }

    /// No call for `wait`, for `why`; a longer quiet already set stands.
    pub(super) fn keep_quiet(&self, wait: Duration, why: String) {
        let until = Instant::now() + wait;
        let mut quiet = self.quiet_until.lock().unwrap_or_else(|e| e.into_inner());
        if quiet.as_ref().is_none_or(|(set, _)| *set < until) {
            *quiet = Some((until, why));
        }
    }

    /// What an answer's headers say of the budget: the gauge, and a quiet
    /// until the reset once only the reserve is left.
    pub(super) fn note_budget(&self, headers: &http::HeaderMap) {
        let Some(Budget {
            remaining,
            reset,
            limit,
        }) = budget(headers)
        else {
            return;
        };
        self.metrics
            .github_rate_limit_remaining
            .store(remaining, Ordering::Relaxed);
        let quiet = self.quiet().is_some();
        let reserve = kept(self.reserve, limit);
        if let Some(wait) = reserve_wait(remaining, reset, now_epoch(), reserve) {
            let kept = format!("{remaining} GitHub requests left, {reserve} of them kept for the token's other users");
            self.keep_quiet(
                wait,
                if reserve == 0 {
                    "GitHub's budget spent".into()
                } else {
                    kept
                },
            );
            if !quiet {
                tracing::warn!(
                    remaining,
                    reserve,
                    wait_seconds = wait.as_secs(),
                    "GitHub budget down to its reserve: no GitHub calls until it resets; releases go on"
                );
            }
        }
    }
}

/// The wait a rate-limited answer asks for: `Retry-After` (seconds), else
/// `X-RateLimit-Reset` (epoch seconds) when no requests remain. `None` for an
/// answer that is not a rate limit.
pub fn rate_limit_wait(status: u16, headers: &http::HeaderMap, now_epoch: u64) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let retry_after = header("retry-after").and_then(|v| v.parse::<u64>().ok());
    let exhausted = header("x-ratelimit-remaining") == Some("0");
    if status != 429 && !(status == 403 && (exhausted || retry_after.is_some())) {
        return None;
    }
    let seconds = retry_after
        .or_else(|| {
            header("x-ratelimit-reset")
                .and_then(|v| v.parse::<u64>().ok())
                .map(|reset| reset.saturating_sub(now_epoch))
        })
        // GitHub's advice when it names no time: wait a minute.
        .unwrap_or(60);
    Some(Duration::from_secs(seconds.clamp(1, 3600)))
}

/// What GitHub's headers say of the budget: requests left in the window,
/// and when it resets (epoch seconds). `None` when an answer carries none
/// (a GitHub Enterprise with rate limits off).
pub fn budget(headers: &http::HeaderMap) -> Option<Budget> {
    let number = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<u64>().ok();
    Some(Budget {
        remaining: number("x-ratelimit-remaining")?,
        reset: number("x-ratelimit-reset")?,
        limit: number("x-ratelimit-limit"),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub remaining: u64,
    /// Epoch seconds.
    pub reset: u64,
    pub limit: Option<u64>,
}

/// The reserve kept: at most half of the window, so that a reserve set for
/// a bigger token never turns GitHub off for a smaller one.
pub fn kept(reserve: u64, limit: Option<u64>) -> u64 {
    limit.map_or(reserve, |limit| reserve.min(limit / 2))
}

/// How long to make no GitHub call after an answer that left `remaining`
/// requests until `reset`: until the reset once no more than `reserve`
/// remain, so that a token shared with people and other tools keeps that
/// many for them. Kubernetes-side steps never wait on it.
pub fn reserve_wait(remaining: u64, reset_epoch: u64, now_epoch: u64, reserve: u64) -> Option<Duration> {
    (remaining <= reserve).then(|| Duration::from_secs(reset_epoch.saturating_sub(now_epoch).clamp(1, 3600)))
}

/// The shape of a request, for the metric: method and path with the
/// repository, numbers, commits, users and branches as placeholders, so
/// that the label's values stay few.
pub fn endpoint(method: &str, uri: &str) -> String {
    let path = uri.split(['?', '#']).next().unwrap_or_default();
    let path = match path.find("://") {
        Some(at) => path[at + 3..].find('/').map_or("/", |slash| &path[at + 3 + slash..]),
        None => path,
    };
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut shaped: Vec<String> = Vec::new();
    let mut rest = segments.as_slice();
    if let ["repos", _, _, tail @ ..] = rest {
        shaped.extend(["repos", "{owner}", "{repo}"].map(String::from));
        rest = tail;
    }
    for segment in rest {
        let previous = shaped.last().map(String::as_str).unwrap_or_default();
        let shape = match previous {
            "commits" | "statuses" if !segment.bytes().all(|b| b.is_ascii_digit()) => "{sha}",
            "collaborators" => "{user}",
            "branches" | "compare" | "heads" => {
                shaped.push("{ref}".to_string());
                break;
            }
            _ if segment.bytes().all(|b| b.is_ascii_digit()) => "{n}",
            _ if segment.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') => segment,
            _ => "{id}",
        };
        shaped.push(shape.to_string());
    }
    format!("{method} /{}", shaped.join("/"))
}

pub(super) fn now_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        pairs
            .iter()
            .map(|(n, v)| (http::HeaderName::from_static(n), v.parse().unwrap()))
            .collect()
    }

    #[test]
    fn an_endpoints_label_names_its_shape_never_a_repository_user_or_branch() {
        let cases = [
            (
                "GET",
                "/repos/acme/apps/commits/abc123def/pulls",
                "GET /repos/{owner}/{repo}/commits/{sha}/pulls",
            ),
            (
                "GET",
                "/repos/acme/apps/issues/17/comments?per_page=100",
                "GET /repos/{owner}/{repo}/issues/{n}/comments",
            ),
            (
                "GET",
                "https://api.github.com/repos/acme/apps/issues/17/comments?per_page=100&page=3",
                "GET /repos/{owner}/{repo}/issues/{n}/comments",
            ),
            (
                "GET",
                "/repos/acme/apps/collaborators/Carol/permission",
                "GET /repos/{owner}/{repo}/collaborators/{user}/permission",
            ),
            (
                "GET",
                "/repos/acme/apps/branches/gitcanary/promote/demo/x",
                "GET /repos/{owner}/{repo}/branches/{ref}",
            ),
            (
                "PUT",
                "/repos/acme/apps/pulls/4/merge",
                "PUT /repos/{owner}/{repo}/pulls/{n}/merge",
            ),
            ("GET", "/user", "GET /user"),
            ("GET", "/repos/acme/apps/weird-Thing", "GET /repos/{owner}/{repo}/{id}"),
        ];
        for (method, uri, shaped) in cases {
            assert_eq!(endpoint(method, uri), shaped, "{uri}");
        }
    }

    #[test]
    fn the_reserve_is_kept_for_the_tokens_other_users_until_the_reset() {
        let answer = headers(&[("x-ratelimit-remaining", "501"), ("x-ratelimit-reset", "1100")]);
        let Budget {
            remaining,
            reset,
            limit,
        } = budget(&answer).unwrap();
        assert_eq!(limit, None);
        assert_eq!(reserve_wait(remaining, reset, 1000, 500), None, "one more may go");
        assert_eq!(reserve_wait(500, reset, 1000, 500), Some(Duration::from_secs(100)));
        assert_eq!(
            reserve_wait(0, 1100, 1000, 0),
            Some(Duration::from_secs(100)),
            "spent: wait, reserve or not"
        );
        assert_eq!(reserve_wait(1, 1100, 1000, 0), None);
        // A reset in the past, or absurdly far: a second, an hour at most.
        assert_eq!(reserve_wait(3, 900, 1000, 10), Some(Duration::from_secs(1)));
        assert_eq!(reserve_wait(3, u64::MAX, 1000, 10), Some(Duration::from_secs(3600)));
        assert_eq!(
            budget(&headers(&[
                ("x-ratelimit-remaining", "many"),
                ("x-ratelimit-reset", "1100")
            ])),
            None
        );
        // A reserve meant for a 5,000 token, on a 600 one: half of it is kept.
        assert_eq!(kept(500, Some(5000)), 500);
        assert_eq!(kept(500, Some(600)), 300);
        assert_eq!(kept(500, None), 500);
        assert_eq!(budget(&http::HeaderMap::new()), None);
    }
}
