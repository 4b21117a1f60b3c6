//! GitHub's rate limit as the agent spends it: the waits GitHub asks for,
//! and the share of a token's budget left to the token's other users. Pure.

use std::time::Duration;

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
pub fn budget(headers: &http::HeaderMap) -> Option<(u64, u64)> {
    let number = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<u64>().ok();
    Some((number("x-ratelimit-remaining")?, number("x-ratelimit-reset")?))
}

/// How long to make no GitHub call after an answer that left `remaining`
/// requests until `reset`: until the reset once no more than `reserve`
/// remain, so that a token shared with people and other tools keeps that
/// many for them. Kubernetes-side steps never wait on it.
pub fn reserve_wait(remaining: u64, reset_epoch: u64, now_epoch: u64, reserve: u64) -> Option<Duration> {
    (remaining <= reserve).then(|| Duration::from_secs(reset_epoch.saturating_sub(now_epoch).clamp(1, 3600)))
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
    fn the_reserve_is_kept_for_the_tokens_other_users_until_the_reset() {
        let answer = headers(&[("x-ratelimit-remaining", "501"), ("x-ratelimit-reset", "1100")]);
        let (remaining, reset) = budget(&answer).unwrap();
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
        assert_eq!(budget(&headers(&[("x-ratelimit-remaining", "many")])), None);
        assert_eq!(budget(&http::HeaderMap::new()), None);
    }
}
