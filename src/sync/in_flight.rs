//! Apps synced a few at a time, each to its end.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{StreamExt, stream};

/// Runs `each` over `items`, `width` at a time, in order. After an error
/// no further item starts, but those in flight run to their end: an app's
/// sync cancelled mid-write would leave what it wrote unrecorded (its
/// status saves the inventory last). Returns every answer, or the first
/// error once the items in flight are done.
pub(super) async fn each_to_its_end<I, T, E, F, Fut>(items: I, width: usize, each: F) -> Result<Vec<T>, E>
where
    I: IntoIterator,
    F: Fn(I::Item) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let stopped = AtomicBool::new(false);
    let (stopped, each) = (&stopped, &each);
    let mut answers = stream::iter(items)
        .map(|item| async move {
            if stopped.load(Ordering::SeqCst) {
                return Ok(None);
            }
            each(item).await.map(Some)
        })
        .buffered(width.max(1));
    let mut done = Vec::new();
    let mut failed = None;
    while let Some(answer) = answers.next().await {
        match answer {
            Ok(answer) => done.extend(answer),
            Err(error) => {
                stopped.store(true, Ordering::SeqCst);
                failed.get_or_insert(error);
            }
        }
    }
    failed.map_or(Ok(done), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn an_error_lets_the_apps_in_flight_finish_and_starts_no_other() {
        let started = Mutex::new(Vec::new());
        let finished = Mutex::new(Vec::new());
        let answer = each_to_its_end(0..5, 2, |app: u32| {
            let (started, finished) = (&started, &finished);
            async move {
                started.lock().unwrap().push(app);
                // App 0 fails while app 1 is still writing.
                let turns = if app == 0 { 2 } else { 20 };
                for _ in 0..turns {
                    tokio::task::yield_now().await;
                }
                if app == 0 {
                    return Err(format!("app {app} failed"));
                }
                finished.lock().unwrap().push(app);
                Ok(app)
            }
        })
        .await;
        assert_eq!(answer, Err("app 0 failed".to_string()));
        assert_eq!(*finished.lock().unwrap(), vec![1], "the app in flight ran to its end");
        let mut started = started.into_inner().unwrap();
        started.sort();
        assert_eq!(started, vec![0, 1], "no app started after the error");
        let all = each_to_its_end(0..5, 2, |app: u32| async move { Ok::<_, String>(app * 10) }).await;
        assert_eq!(all, Ok(vec![0, 10, 20, 30, 40]));
    }
}
