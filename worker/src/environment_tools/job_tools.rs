//! `job_status` and `job_kill`: asked of the runner the job runs on (`bash {background:true}`
//! started it), for this session's jobs only.

use super::*;

/// `job_status {id}` / `job_kill {id}`: asks the job's runner (the session's owner asks; the
/// job was approved when it started). A finished job's status comes from the session's record.
pub(super) async fn job_tool(ctx: &ToolContext, call: &ToolCall) -> ToolOutput {
    let Some(id) = call.arguments.get("id").and_then(Value::as_str) else {
        return ToolOutput::text(Err(format!(
            "Invalid arguments for {}: `id` (the job id bash returned) is required",
            call.name
        )));
    };
    let Some(record) = ctx.jobs.get(id) else {
        return ToolOutput::text(Err(format!(
            "No background job {id:?} in this session (bash with background: true returns a job id)."
        )));
    };
    if record.state.is_finished() {
        let text = match &record.report {
            Some(report) => wuhu_core::jobs::finished_message(&record, report).content,
            None => format!("Job {id} {}.", record.state.as_str()),
        };
        return ToolOutput::text(Ok(text));
    }
    let answer = runner_client::ask_job(
        &ctx.env,
        &ctx.session.tenant,
        &ctx.session.owner,
        &ctx.session.session_id,
        &record,
        &call.name,
    )
    .await;
    match answer {
        Ok(RunnerMessage::ToolResult {
            content, is_error, ..
        }) => ToolOutput::text(if is_error { Err(content) } else { Ok(content) }),
        Ok(other) => ToolOutput::text(Err(format!(
            "Runner {:?} answered unexpectedly: {other:?}",
            record.runner
        ))),
        Err(e) if e.code == codes::RUNNER_NOT_CONNECTED => ToolOutput::text(Err(format!(
            "Runner {:?} is not connected, so job {id} cannot be reached now. If the runner \
             does not come back soon, the job fails and a wuhu_job_finished_v1 message says \
             so.",
            record.runner
        ))),
        Err(e) => ToolOutput::text(Err(runner_error(&record.runner, &e))),
    }
}
