//! The dashboard's pages, rendered on the server: plain HTML with inline
//! SVG, readable without colour or script, and a few lines of script that
//! swap in each newer rendering the server sends. Pure: a view in, HTML out.
//! Only what `kubectl get` shows of Rollouts, pods and Events is on a page.

use std::fmt::Write;

use crate::rollout::api::{Phase, RolloutSpec, RolloutStatus};

/// One Rollout on the list page.
#[derive(Debug, Clone, Default)]
pub struct RolloutRow {
    pub namespace: String,
    pub name: String,
    pub status: RolloutStatus,
    pub created: String,
}

pub use crate::rollout::model::BatchPod;

/// An Event of the Rollout, newest last.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventLine {
    pub time: String,
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

/// What the release page shows of one Rollout.
#[derive(Debug, Clone, Default)]
pub struct ReleaseView {
    pub namespace: String,
    pub name: String,
    pub spec: RolloutSpec,
    pub status: RolloutStatus,
    pub pods: Vec<BatchPod>,
    pub events: Vec<EventLine>,
    pub stable_images: Vec<String>,
    pub canary_images: Vec<String>,
    /// `OWNER/REPO` on GitHub: commits and the gate are linked.
    pub github_repo: Option<String>,
    /// Where the agent keeps its records: the gate's branch is named by it.
    pub records: crate::rollout::record::Records,
    /// The Rollout's release in every environment of the waves, from Git.
    pub environments: Vec<crate::wave::standing::Standing>,
    /// With actions allowed: the token their forms carry.
    pub actions: Option<String>,
}

/// What HTML reads as markup, and the entity that shows it as text.
/// Quotes by code point: a quote character literal misleads line counters.
const ENTITIES: [(char, &str); 5] = [
    ('&', "&amp;"),
    ('<', "&lt;"),
    ('>', "&gt;"),
    ('\u{22}', "&quot;"),
    ('\u{27}', "&#39;"),
];

/// Text made safe for HTML, in an element or an attribute.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match ENTITIES.iter().find(|(markup, _)| *markup == c) {
            Some((_, entity)) => out.push_str(entity),
            None => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0 auto;max-width:60rem;padding:1rem;line-height:1.4}\
table{border-collapse:collapse;width:100%}th,td{border-bottom:1px solid #999;padding:.3rem;text-align:left;vertical-align:top}\
.table{overflow-x:auto}svg{max-width:100%;height:auto}#traffic-chart{max-width:32rem}.problem{font-weight:bold}code{word-break:break-all}";

/// The page's one script (served as `/live.js`, so the pages' policy
/// runs no inline script): newer renderings come from the page's own
/// address + `/live` and take the place of its `main`.
pub const LIVE_SCRIPT: &str = "new EventSource(location.pathname+'/live').addEventListener('page',e=>{document.querySelector('main').outerHTML=e.data;});\n";

/// A whole page around `main`, followed live when `live`.
pub fn document(title: &str, main: &str, live: bool) -> String {
    let script = if live { "<script src=/live.js></script>" } else { "" };
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport content=\"width=device-width,initial-scale=1\"><title>{}</title><style>{STYLE}</style></head><body>{main}{script}</body></html>",
        escape(title)
    )
}

/// Failed releases first, then paused ones, then those under way, then the rest.
fn urgency(phase: Phase) -> u8 {
    match phase {
        Phase::Failed => 0,
        Phase::Paused => 1,
        Phase::Progressing | Phase::Promoting | Phase::Reverting => 2,
        Phase::Healthy => 3,
    }
}

/// The list page's `main`: every Rollout, problems first.
pub fn list(rows: &[RolloutRow]) -> String {
    let mut rows: Vec<&RolloutRow> = rows.iter().collect();
    rows.sort_by(|a, b| {
        (urgency(a.status.phase), &a.namespace, &a.name).cmp(&(urgency(b.status.phase), &b.namespace, &b.name))
    });
    let mut out = String::from(
        "<main><h1>Rollouts</h1><div class=table><table><thead><tr><th>Rollout</th><th>Phase</th><th>Step</th><th>Traffic</th><th>Release</th><th>Message</th><th>Created</th></tr></thead><tbody>",
    );
    for row in rows {
        let canary = row.status.canary_status.clone().unwrap_or_default();
        let phase = format!("{:?}", row.status.phase);
        let class = if row.status.phase == Phase::Failed {
            " class=problem"
        } else {
            ""
        };
        let _ = write!(
            out,
            "<tr{class}><td><a href=\"/rollouts/{ns}/{name}\">{ns}/{name}</a></td><td>{phase}</td><td>{step}</td><td>{traffic}</td><td>{id}</td><td>{message}</td><td>{created}</td></tr>",
            ns = escape(&row.namespace),
            name = escape(&row.name),
            step = canary.current_step_index,
            traffic = escape(&canary.traffic),
            id = escape(&row.status.rollout_id),
            message = escape(&canary.message),
            created = escape(&row.created),
        );
    }
    out.push_str("</tbody></table></div></main>");
    out
}

/// The release page's `main`.
pub fn release(view: &ReleaseView) -> String {
    let status = &view.status;
    let canary = status.canary_status.clone().unwrap_or_default();
    let mut out = format!(
        "<main><p><a href=\"/\">All Rollouts</a></p><h1>{}/{}</h1><p id=summary><strong>{:?}</strong>, release <code>{}</code>, step {} of {} ({}), traffic to the canary <strong id=traffic>{}</strong></p><p id=message>{}</p>",
        escape(&view.namespace),
        escape(&view.name),
        status.phase,
        escape(&status.rollout_id),
        canary.current_step_index,
        view.spec.strategy.canary.steps.len(),
        canary.current_step_state.name(),
        escape(&canary.traffic),
        escape(&canary.message),
    );
    buttons(&mut out, view);
    timeline(&mut out, view);
    traffic_chart(&mut out, view);
    analysis(&mut out, status);
    batches(&mut out, &view.pods);
    versions(&mut out, view);
    environments(&mut out, &view.environments);
    events(&mut out, &view.events);
    out.push_str("</main>");
    out
}

/// Promote (at a pause that waits for one) and abort (while a release
/// runs), each naming the release and step this page shows.
fn buttons(out: &mut String, view: &ReleaseView) {
    let Some(token) = &view.actions else {
        return;
    };
    let status = &view.status;
    let running = matches!(status.phase, Phase::Progressing | Phase::Paused | Phase::Promoting);
    if !running {
        return;
    }
    let step = status.canary_status.as_ref().map_or(0, |c| c.current_step_index);
    let form = |action: &str, label: &str| {
        format!(
            "<form method=post action=\"/rollouts/{}/{}/{action}\" style=\"display:inline\"><input type=hidden name=csrf value=\"{}\"><input type=hidden name=commit value=\"{}\"><input type=hidden name=step value={step}><button id={action}>{label}</button></form> ",
            escape(&view.namespace),
            escape(&view.name),
            escape(token),
            escape(&status.canary_commit)
        )
    };
    out.push_str("<p id=actions>");
    if crate::github::gate::waiting_step(&view.spec, status).is_some() {
        out.push_str(&form("promote", "Promote"));
    }
    out.push_str(&form("abort", "Abort"));
    out.push_str("</p>");
}

fn timeline(out: &mut String, view: &ReleaseView) {
    let canary = view.status.canary_status.clone().unwrap_or_default();
    out.push_str("<h2>Steps</h2><div class=table><table id=steps><thead><tr><th>Step</th><th>Traffic</th><th>State</th><th>Started</th><th>Finished</th><th>Passed by</th></tr></thead><tbody>");
    for (i, step) in view.spec.strategy.canary.steps.iter().enumerate() {
        let index = i as u32 + 1;
        let record = view.status.step_history.iter().find(|r| r.step == index);
        let state = match record {
            Some(r) if !r.finished_at.is_empty() => "passed".to_string(),
            _ if index == canary.current_step_index && view.status.phase != Phase::Healthy => {
                format!("now: {}", canary.current_step_state.name())
            }
            _ => "to come".to_string(),
        };
        let _ = write!(
            out,
            "<tr><td>{index}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(step.traffic.as_deref().unwrap_or("-")),
            escape(&state),
            escape(record.map_or("", |r| r.started_at.as_str())),
            escape(record.map_or("", |r| r.finished_at.as_str())),
            escape(record.map_or("", |r| r.passed_by.as_str())),
        );
    }
    out.push_str("</tbody></table></div>");
}

/// The canary's share at each step so far, as a step chart.
fn traffic_chart(out: &mut String, view: &ReleaseView) {
    let steps = &view.spec.strategy.canary.steps;
    let reached = view.status.canary_status.as_ref().map_or(0, |c| c.current_step_index) as usize;
    let (width, height, left, bottom) = (400.0, 160.0, 40.0, 20.0);
    let x = |i: usize| left + (width - left) * i as f64 / steps.len().max(1) as f64;
    let y = |percent: f64| (height - bottom) * (1.0 - percent / 100.0);
    let mut points = vec![format!("{},{}", x(0), y(0.0))];
    let mut share = 0.0;
    for (i, step) in steps.iter().enumerate().take(reached) {
        let next = step
            .traffic
            .as_deref()
            .and_then(|t| crate::rollout::plan::parse_percent(t).ok())
            .map_or(share, f64::from);
        points.push(format!("{},{}", x(i), y(next)));
        points.push(format!("{},{}", x(i + 1), y(next)));
        share = next;
    }
    let _ = write!(
        out,
        "<h2>Traffic</h2><svg id=traffic-chart role=img viewBox=\"0 0 {width} {height}\"><title>traffic to the canary by step: now {share}%</title>\
<line x1={left} y1=0 x2={left} y2={base} stroke=currentColor /><line x1={left} y1={base} x2={width} y2={base} stroke=currentColor />\
<text x=0 y=12 font-size=10>100%</text><text x=0 y={base} font-size=10>0%</text>\
<polyline fill=none stroke=currentColor stroke-width=2 points=\"{}\" /></svg>",
        points.join(" "),
        base = height - bottom,
    );
}

fn analysis(out: &mut String, status: &RolloutStatus) {
    let runs: Vec<_> = status
        .analysis_runs
        .iter()
        .filter(|r| r.rollout_id == status.rollout_id)
        .collect();
    if runs.is_empty() {
        return;
    }
    out.push_str("<h2>Analysis and hooks</h2><div class=table><table id=analysis><thead><tr><th>Run</th><th>Template</th><th>Measurements</th><th>Last</th></tr></thead><tbody>");
    for run in runs {
        let total = (run.successful + run.failed + run.inconclusive).max(1) as f64;
        let bar = |count: u32, offset: f64, label: &str| {
            format!(
                "<rect x={offset:.1} y=0 width={:.1} height=12 fill=currentColor fill-opacity={}><title>{count} {label}</title></rect>",
                100.0 * f64::from(count) / total,
                match label {
                    "successful" => "0.3",
                    "failed" => "1",
                    _ => "0.6",
                }
            )
        };
        let ok = 100.0 * f64::from(run.successful) / total;
        let failed = 100.0 * f64::from(run.failed) / total;
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{} successful, {} failed, {} inconclusive<br><svg viewBox=\"0 0 100 12\" width=100 height=12 role=img>{}{}{}</svg></td><td>{}</td></tr>",
            escape(&run.name),
            escape(&run.template),
            run.successful,
            run.failed,
            run.inconclusive,
            bar(run.successful, 0.0, "successful"),
            bar(run.failed, ok, "failed"),
            bar(run.inconclusive, ok + failed, "inconclusive"),
            escape(&run.message),
        );
    }
    out.push_str("</tbody></table></div>");
}

fn batches(out: &mut String, pods: &[BatchPod]) {
    out.push_str("<h2>Pods by batch</h2>");
    if pods.is_empty() {
        out.push_str("<p id=pods>No canary pods.</p>");
        return;
    }
    out.push_str("<div class=table><table id=pods><thead><tr><th>Batch</th><th>Pod</th><th>Ready</th><th>Restarts</th></tr></thead><tbody>");
    let mut pods: Vec<&BatchPod> = pods.iter().collect();
    pods.sort_by(|a, b| (&a.batch, &a.name).cmp(&(&b.batch, &b.name)));
    for pod in pods {
        let _ = write!(
            out,
            "<tr><td>batch {}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&pod.batch),
            escape(&pod.name),
            if pod.ready { "ready" } else { "not ready" },
            pod.restarts
        );
    }
    out.push_str("</tbody></table></div>");
}

fn commit_link(repo: Option<&str>, commit: &str) -> String {
    let short = crate::short_commit(commit);
    match repo {
        Some(repo) if !commit.is_empty() => format!(
            "<a href=\"https://github.com/{}/commit/{}\"><code>{}</code></a>",
            escape(repo),
            escape(commit),
            escape(short)
        ),
        _ => format!("<code>{}</code>", escape(short)),
    }
}

/// Each environment in the waves' order, this cluster's marked.
fn environments(out: &mut String, standings: &[crate::wave::standing::Standing]) {
    if standings.is_empty() {
        return;
    }
    out.push_str("<h2>Environments</h2><ol id=environments>");
    for standing in standings {
        let here = if standing.here { " (this cluster)" } else { "" };
        let _ = write!(
            out,
            "<li><strong>{}</strong>{here}: {}</li>",
            escape(&standing.environment),
            escape(&standing.describe())
        );
    }
    out.push_str("</ol>");
}

fn versions(out: &mut String, view: &ReleaseView) {
    let status = &view.status;
    let repo = view.github_repo.as_deref();
    let images = |images: &[String]| escape(&images.join(", "));
    let _ = write!(
        out,
        "<h2>Versions</h2><div class=table><table id=versions><tbody><tr><th>Stable</th><td>{}</td><td>{}</td><td>{}</td></tr><tr><th>Canary</th><td>{}</td><td>{}</td><td>{}</td></tr></tbody></table></div>",
        commit_link(repo, &status.stable_commit),
        images(&view.stable_images),
        escape(&status.stable_revision),
        commit_link(repo, &status.canary_commit),
        images(&view.canary_images),
        escape(&status.canary_revision),
    );
    out.push_str("<h2>In Git</h2><ul id=git>");
    if let Some(gate) = crate::github::gate::waiting_step(&view.spec, status) {
        let branch = view
            .records
            .gate_branch(&view.namespace, &view.name, &status.rollout_id, gate);
        let link = match repo {
            Some(repo) => format!(
                "<a id=gate href=\"https://github.com/{}/pulls?q=is%3Apr+head%3A{}\">the promotion pull request</a>",
                escape(repo),
                escape(&branch)
            ),
            None => "the promotion pull request".to_string(),
        };
        let _ = write!(
            out,
            "<li>Waiting at step {gate} for a promote: {link} (branch <code>{}</code>), <code>/gitcanary promote</code>, or <code>gitcanary promote {} -n {}</code></li>",
            escape(&branch),
            escape(&view.name),
            escape(&view.namespace)
        );
    }
    if !status.canary_commit.is_empty() {
        let _ = write!(out, "<li>The change: {}</li>", commit_link(repo, &status.canary_commit));
    }
    if let Some(written) = status
        .written_back
        .as_ref()
        .filter(|w| w.rollout_id == status.rollout_id)
    {
        let _ = write!(
            out,
            "<li>Written back ({:?}): {}</li>",
            written.action,
            commit_link(repo, &written.commit)
        );
    }
    out.push_str("</ul>");
}

fn events(out: &mut String, events: &[EventLine]) {
    out.push_str("<h2>Events</h2><ol id=events>");
    for event in events.iter().rev().take(30) {
        let _ = write!(
            out,
            "<li>{} {}{}: {}</li>",
            escape(&event.time),
            if event.warning { "warning " } else { "" },
            escape(&event.reason),
            escape(&event.note)
        );
    }
    out.push_str("</ol>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::api::CanaryStatus;

    fn row(name: &str, phase: Phase) -> RolloutRow {
        RolloutRow {
            namespace: "shop".into(),
            name: name.into(),
            status: RolloutStatus {
                phase,
                ..RolloutStatus::default()
            },
            created: String::new(),
        }
    }

    #[test]
    fn the_list_shows_failed_releases_first_then_paused_ones() {
        let page = list(&[
            row("a-healthy", Phase::Healthy),
            row("b-paused", Phase::Paused),
            row("c-failed", Phase::Failed),
        ]);
        let at = |name: &str| page.find(name).expect(name);
        assert!(
            at("c-failed") < at("b-paused") && at("b-paused") < at("a-healthy"),
            "{page}"
        );
    }

    #[test]
    fn the_release_page_tells_each_environment_in_order() {
        use crate::wave::standing::Standing;
        let view = ReleaseView {
            namespace: "shop".into(),
            name: "web".into(),
            environments: vec![
                Standing {
                    environment: "staging".into(),
                    here: true,
                    record: Ok(None),
                },
                Standing {
                    environment: "production".into(),
                    here: false,
                    record: Err("<b>forged</b>".into()),
                },
            ],
            ..ReleaseView::default()
        };
        let page = release(&view);
        assert!(
            page.contains("<ol id=environments><li><strong>staging</strong> (this cluster): no release recorded</li><li><strong>production</strong>: record not trusted: &lt;b&gt;forged&lt;/b&gt;</li></ol>"),
            "{page}"
        );
        assert!(
            !release(&ReleaseView::default()).contains("id=environments"),
            "no waves, no section"
        );
    }

    #[test]
    fn every_character_html_reads_as_markup_is_shown_as_text() {
        assert_eq!(
            escape(r#"a&b<c>d"e'f"#),
            "a&amp;b&lt;c&gt;d&quot;e&#39;f",
            "in an element or an attribute quoted either way"
        );
        assert_eq!(escape("plain é"), "plain é");
    }

    #[test]
    fn text_from_git_or_the_cluster_is_escaped() {
        let mut view = ReleaseView {
            namespace: "shop".into(),
            name: "web".into(),
            ..ReleaseView::default()
        };
        view.status.canary_status = Some(CanaryStatus {
            message: "<script>alert(1)</script>".into(),
            ..CanaryStatus::default()
        });
        view.events.push(EventLine {
            note: "\"><img src=x onerror=alert(1)>".into(),
            ..EventLine::default()
        });
        let page = release(&view);
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(!page.contains("<img"), "{page}");
        assert!(page.contains("&lt;script&gt;"));
        let title = document("<x>", "", true);
        assert!(title.contains("<title>&lt;x&gt;</title>"));
    }
}
