//! `gitcanary dashboard`.

use std::process::ExitCode;

use super::ClusterArgs;
use crate::Error;
use crate::cluster::Cluster;

/// `gitcanary dashboard`: serves until stopped; prints its URL once listening.
pub async fn dashboard(
    args: &ClusterArgs,
    listen: &str,
    namespace: Option<String>,
    github_repo: Option<String>,
    (allow_actions, environments): (bool, super::EnvironmentsArgs),
) -> Result<ExitCode, Error> {
    use std::io::Write;
    let actions = match allow_actions {
        true => Some(crate::dashboard::new_token().map_err(|e| Error::Usage(format!("a token for the forms: {e}")))?),
        false => None,
    };
    if github_repo.as_deref().is_some_and(|r| r.split('/').count() != 2) {
        return Err(Error::Usage("--github-repo: write OWNER/REPO".into()));
    }
    let cluster = Cluster::connect(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| Error::Usage(format!("--listen {listen}: {e}")))?;
    let address = listener
        .local_addr()
        .map_err(|e| Error::Usage(format!("--listen {listen}: {e}")))?;
    if actions.is_some() && !address.ip().is_loopback() {
        return Err(Error::Usage(
            "--allow-actions listens on a loopback address only: anyone who can load a page could press its buttons"
                .into(),
        ));
    }
    println!("dashboard: http://{address}/");
    let _ = std::io::stdout().flush();
    let dashboard = crate::dashboard::Dashboard {
        cluster,
        namespace,
        github_repo,
        records: args.records(),
        environments: environments.reader(args.records())?,
        actions,
        loopback: address.ip().is_loopback(),
        streams: std::sync::Arc::new(tokio::sync::Semaphore::new(crate::dashboard::MAX_STREAMS)),
    };
    crate::dashboard::serve(listener, std::sync::Arc::new(dashboard))
        .await
        .map_err(|e| Error::Usage(format!("the dashboard stopped: {e}")))?;
    Ok(ExitCode::SUCCESS)
}
