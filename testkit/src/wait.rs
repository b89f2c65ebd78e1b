//! Waiting for a condition with a deadline, instead of sleeping a fixed time.

use std::future::Future;
use std::time::Duration;

use anyhow::{bail, Result};
use tokio::time::Instant;

/// How often a condition is checked again.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Checks `check` every 50 ms until it returns `Ok(Some(value))`, and returns that value.
/// `Ok(None)` means "not yet"; an error counts as "not yet" too (a broker that is still
/// starting refuses connections), and the last one is reported if the deadline passes.
/// Fails after `timeout`, naming `what` was awaited.
pub async fn wait_until<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    loop {
        // The check itself may block on a dead peer: bound it by the deadline too.
        match tokio::time::timeout_at(deadline, check()).await {
            Ok(Ok(Some(value))) => return Ok(value),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => last_error = Some(e),
            Err(_) => {}
        }
        if Instant::now() + POLL_INTERVAL > deadline {
            match last_error {
                Some(e) => bail!("timed out after {timeout:?} waiting for {what}; last error: {e:#}"),
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_value_once_the_condition_holds_and_names_what_timed_out() {
        let mut calls = 0;
        let value = wait_until(Duration::from_secs(5), "the third call", || {
            calls += 1;
            let now = calls;
            async move { Ok((now >= 3).then_some(now)) }
        })
        .await
        .unwrap();
        assert_eq!(value, 3);

        let started = std::time::Instant::now();
        let error =
            wait_until(Duration::from_millis(200), "nothing", || async { Result::<Option<()>>::Err(anyhow::anyhow!("refused")) })
                .await
                .unwrap_err()
                .to_string();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(error.contains("waiting for nothing") && error.contains("refused"), "{error}");
    }
}
