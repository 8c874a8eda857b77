//! Every operation of [`ROUTES`](super::super::ROUTES), as an [`Op`]: its summary, its
//! parameters and body, what it answers and which errors.

use schemars::SchemaGenerator;
use serde_json::json;

use super::{s, Op};
use crate::api::shapes as sh;

/// What operation `name` of [`ROUTES`] takes and answers.
pub(super) fn operation(name: &str, g: &mut SchemaGenerator) -> Op {
    match name {
        "health" => Op::new("Server health", "server")
            .public()
            .ok(200, "Healthy.", vec![("application/json", s::<sh::Health>(g))])
            .err(&[500, 503]),
        "openapi" => Op::new("This document", "server")
            .public()
            .ok(200, "The OpenAPI document.", vec![("application/json", json!({"type": "object"}))])
            .err(&[500]),
        "tls.ca" => Op::new("The CA of the listener's TLS", "server")
            .desc("The listener speaks TLS on its port too (the hosts of sandbox ports, `https://{port}-{id}.{domain}`, are reached with it); its certificates are minted by this CA unless the operator gave one. Trust it in the browser or client that opens those URLs.")
            .public()
            .ok(200, "The CA certificate, PEM.", vec![("application/x-pem-file", json!({"type": "string"}))])
            .err(&[404, 500]),
        "console.page" => Op::new("The web console", "console")
            .desc("The console's page (docs/console.md). It calls this API with the key typed into it; the page itself needs none.")
            .public()
            .ok(200, "The page (`304` when the `If-None-Match` tag is current).", vec![("text/html", json!({"type": "string"}))])
            .err(&[404, 500]),
        "console.file" => Op::new("A file of the web console", "console")
            .desc("The console's scripts, styles and vendored libraries, embedded in the binary.")
            .public()
            .param("ConsolePath")
            .ok(200, "The file (`304` when the `If-None-Match` tag is current).", vec![("*/*", json!({"type": "string"}))])
            .err(&[400, 404, 500]),
        "metrics" => Op::new("Prometheus metrics", "server")
            .desc("Counters `space_api_requests_total{operation, status}`, histogram `space_api_request_duration_seconds{operation}`, gauges `space_sandboxes{state}`, `space_pool_ready{template}`, `space_pool_size{template}`.")
            .public()
            .ok(200, "Prometheus text exposition format.", vec![("text/plain", json!({"type": "string"}))])
            .err(&[500]),
        "template.list" => Op::new("List templates", "templates")
            .ok(200, "Every template.", vec![("application/json", s::<sh::TemplateList>(g))])
            .err(&[401, 500]),
        "template.build" => Op::new("Build a template", "templates")
            .desc("Starts a build and answers at once with the build (`state` `running`); with `?wait=true` answers when it is done: the build (`state` `succeeded`, and `template`), or the build's error. A tenant's builds make templates only it sees; a public name takes builds from admins only.")
            .query::<crate::api::templates::WaitQuery>(g)
            .body(true, vec![("application/json", s::<sh::TemplateBuildRequest>(g))])
            .ok(202, "The build, running.", vec![("application/json", s::<sh::Build>(g))])
            .err(&[400, 401, 403, 404, 409, 413, 415, 500, 502, 503]),
        "template.delete" => Op::new("Delete a template version (an admin, or the tenant that owns it)", "templates")
            .desc("`409 conflict` while a sandbox that is not terminated was created from it.")
            .param("TemplateName")
            .param("TemplateVersion")
            .ok(204, "Deleted.", vec![])
            .err(&[400, 401, 403, 404, 409, 500]),
        "sandbox.create" => Op::new("Create a sandbox", "sandboxes")
            .param("IdempotencyKey")
            .body(true, vec![("application/json", s::<crate::api::sandboxes::CreateBody>(g))])
            .ok(201, "The new sandbox, running.", vec![("application/json", s::<sh::Sandbox>(g))])
            .err_desc(422, "The Idempotency-Key was used for a create that asked for something else (idempotency_key_reused).")
            .err(&[400, 401, 404, 409, 413, 415, 429, 500, 502, 503]),
        "sandbox.list" => Op::new("List the caller's sandboxes", "sandboxes")
            .desc("Filters combine with AND. `metadata.K=V` (any number of them) keeps sandboxes whose metadata key `K` is `V`.")
            .param_inline(json!({"name": "state", "in": "query", "required": false, "schema": s::<sh::SandboxState>(g), "description": "Only sandboxes in this state. Terminated sandboxes are listed only with `state=terminated`."}))
            .param_inline(json!({"name": "template", "in": "query", "required": false, "schema": s::<sh::Name>(g), "description": "Only sandboxes of this template."}))
            .ok(200, "The caller's sandboxes, newest first.", vec![("application/json", s::<sh::SandboxList>(g))])
            .err(&[400, 401, 500]),
        "sandbox.get" => Op::new("Get a sandbox", "sandboxes")
            .param("SandboxId")
            .ok(200, "The sandbox.", vec![("application/json", s::<sh::Sandbox>(g))])
            .err(&[400, 401, 404, 500]),
        "sandbox.kill" => Op::new("Kill a sandbox", "sandboxes")
            .param("SandboxId")
            .ok(200, "The sandbox, terminated; its record and snapshots stay.", vec![("application/json", s::<sh::Sandbox>(g))])
            .err(&[400, 401, 404, 409, 500]),
        "sandbox.pause" => Op::new("Pause a sandbox (vCPUs stop, memory stays)", "sandboxes")
            .param("SandboxId")
            .ok(200, "The sandbox in its new state.", vec![("application/json", s::<sh::Sandbox>(g))])
            .err(&[400, 401, 404, 409, 500, 502]),
        "sandbox.resume" => Op::new("Resume a paused sandbox", "sandboxes")
            .param("SandboxId")
            .ok(200, "The sandbox in its new state.", vec![("application/json", s::<sh::Sandbox>(g))])
            .err(&[400, 401, 404, 409, 500, 502]),
        "sandbox.suspend" => Op::new("Suspend a sandbox (full snapshot, VM exits)", "sandboxes")
            .param("SandboxId")
            .ok(200, "The sandbox in its new state.", vec![("application/json", s::<sh::Sandbox>(g))])
            .err(&[400, 401, 404, 409, 500, 502]),
        "sandbox.restore" => Op::new("Restore a suspended sandbox", "sandboxes")
            .param("SandboxId")
            .ok(200, "The sandbox in its new state.", vec![("application/json", s::<sh::Sandbox>(g))])
            .err(&[400, 401, 404, 409, 429, 500, 502, 503]),
        "sandbox.fork" => Op::new("Fork a sandbox", "sandboxes")
            .param("SandboxId")
            .ok(201, "The child, owned by the caller's tenant.", vec![("application/json", s::<sh::Sandbox>(g))])
            .err(&[400, 401, 404, 409, 429, 500, 502, 503]),
        "sandbox.set_timeouts" => Op::new("Change a sandbox's timeouts", "sandboxes")
            .param("SandboxId")
            .body(true, vec![("application/json", s::<crate::api::sandboxes::TimeoutsBody>(g))])
            .ok(200, "The sandbox.", vec![("application/json", s::<sh::Sandbox>(g))])
            .err(&[400, 401, 404, 409, 413, 415, 500]),
        "sandbox.logs" => Op::new("The end of the serial console", "sandboxes")
            .param("SandboxId")
            .query::<crate::api::sandboxes::LogsQuery>(g)
            .ok(200, "Console text.", vec![("text/plain", json!({"type": "string"}))])
            .err(&[400, 401, 404, 500]),
        "sandbox.metrics" => Op::new("A sandbox's resource samples", "sandboxes")
            .desc("One sample every few seconds while it runs (CPU, memory, disk, traffic through the gateway); older samples are merged into longer spans so a long life stays bounded. Does not wake the sandbox.")
            .param("SandboxId")
            .query::<crate::api::sandboxes::MetricsQuery>(g)
            .ok(200, "Samples, oldest first.", vec![("application/json", s::<sh::MetricList>(g))])
            .err(&[400, 401, 404, 500, 502, 503]),
        "sandbox.exec" => Op::new("Run a command", "exec")
            .desc("Errors before the process started are ordinary JSON errors with their status.")
            .param("SandboxId")
            .body(true, vec![("application/json", s::<sh::ExecRequest>(g))])
            .ok(200, "One ExecEvent a line; `exit` or `error` is the last.", vec![("application/x-ndjson", s::<sh::ExecEvent>(g))])
            .err(&[400, 401, 404, 409, 413, 415, 500, 502]),
        "sandbox.exec_ws" => Op::new("Run a command over a WebSocket", "exec")
            .desc("The client's first message is an ExecRequest as text. Server to client: binary frames whose first byte is 1 (stdout) or 2 (stderr), then the data; text frames with the `started`, `exit` and `error` objects of ExecEvent; the server closes after `exit`. Client to server: binary frames are stdin; text frames are ExecWsClientMessage (`eof` closes stdin, `signal` signals the process).")
            .param("SandboxId")
            .ok(101, "Switching Protocols: the WebSocket is open.", vec![])
            .err(&[400, 401, 404, 409, 500, 502])
            .ext("x-websocket", json!({"client_first_text": s::<sh::ExecRequest>(g), "client_text": s::<sh::ExecWsClientMessage>(g), "client_binary": "stdin bytes", "server_text": s::<sh::ExecEvent>(g), "server_binary": "first byte 1 (stdout) or 2 (stderr), then the data"})),
        "sandbox.pty" => Op::new("Open a terminal over a WebSocket", "exec")
            .desc("The client's first message is a PtyRequest as text. Then binary frames both ways are terminal bytes; the client sends PtyResize as text; the server sends an ExecExit object as text when the shell ends, then closes.")
            .param("SandboxId")
            .ok(101, "Switching Protocols: the WebSocket is open.", vec![])
            .err(&[400, 401, 404, 409, 500, 502])
            .ext("x-websocket", json!({"client_first_text": s::<sh::PtyRequest>(g), "client_text": s::<sh::PtyResize>(g), "client_binary": "terminal input", "server_text": s::<sh::ExecExit>(g), "server_binary": "terminal output"})),
        "files.download" => Op::new("Download a file", "files")
            .param("SandboxId")
            .param("FilePath")
            .ok(200, "The file's bytes, streamed.", vec![("application/octet-stream", json!({"type": "string", "contentMediaType": "application/octet-stream"}))])
            .err(&[400, 401, 403, 404, 409, 500, 502]),
        "files.upload" => Op::new("Upload a file", "files")
            .desc("The file is replaced atomically: an upload that fails or is over the limit leaves the old file.")
            .param("SandboxId")
            .param("FileTargetPath")
            .param_inline(json!({"name": "mode", "in": "query", "required": false, "schema": {"type": "string", "pattern": "^0?[0-7]{1,4}$"}, "description": "Octal permission bits; an existing file keeps its mode, a new one gets 0644."}))
            .body(true, vec![("application/octet-stream", json!({"type": "string", "contentMediaType": "application/octet-stream"}))])
            .ok(200, "The new file.", vec![("application/json", s::<sh::FileStat>(g))])
            .err(&[400, 401, 403, 404, 409, 413, 500, 502, 507]),
        "files.remove" => Op::new("Remove a file or directory", "files")
            .param("SandboxId")
            .param("FileTargetPath")
            .param_inline(json!({"name": "recursive", "in": "query", "required": false, "schema": {"type": "boolean", "default": false}, "description": "Remove a directory and its contents."}))
            .ok(204, "Removed.", vec![])
            .err(&[400, 401, 403, 404, 409, 500, 502]),
        "files.list" => Op::new("List a directory", "files")
            .param("SandboxId")
            .param("FilePath")
            .ok(200, "Entries sorted by name.", vec![("application/json", s::<sh::DirListing>(g))])
            .err(&[400, 401, 403, 404, 409, 413, 500, 502]),
        "files.stat" => Op::new("Describe a path", "files")
            .param("SandboxId")
            .param("FilePath")
            .ok(200, "The path (a symlink is reported as one).", vec![("application/json", s::<sh::FileStat>(g))])
            .err(&[400, 401, 403, 404, 409, 500, 502]),
        "files.mkdir" => Op::new("Make a directory", "files")
            .param("SandboxId")
            .body(true, vec![("application/json", s::<sh::MkdirRequest>(g))])
            .ok(200, "The directory.", vec![("application/json", s::<sh::FileStat>(g))])
            .err(&[400, 401, 403, 404, 409, 413, 415, 500, 502, 507]),
        "files.rename" => Op::new("Rename a path", "files")
            .param("SandboxId")
            .body(true, vec![("application/json", s::<sh::RenameRequest>(g))])
            .ok(200, "The renamed path.", vec![("application/json", s::<sh::FileStat>(g))])
            .err(&[400, 401, 403, 404, 409, 413, 415, 500, 502, 507]),
        "files.watch" => Op::new("Watch a directory", "files")
            .param("SandboxId")
            .param("FilePath")
            .param_inline(json!({"name": "recursive", "in": "query", "required": false, "schema": {"type": "boolean", "default": false}, "description": "Watch subdirectories too."}))
            .ok(200, "One WatchEvent a line, until the client goes away; a StreamError line last when the watch broke.", vec![("application/x-ndjson", json!({"oneOf": [s::<sh::WatchEvent>(g), s::<sh::StreamError>(g)]}))])
            .err(&[400, 401, 403, 404, 409, 500, 502, 503]),
        "volume.list" => Op::new("List the tenant's volumes", "volumes")
            .ok(200, "The volumes, by name.", vec![("application/json", s::<sh::VolumeList>(g))])
            .err(&[401, 500]),
        "volume.create" => Op::new("Make a volume", "volumes")
            .desc("A file system of the tenant's that outlives sandboxes: creates mount it by name (`volumes` of a sandbox create), several at once.")
            .body(true, vec![("application/json", s::<crate::api::volumes::CreateBody>(g))])
            .ok(201, "The volume.", vec![("application/json", s::<sh::Volume>(g))])
            .err(&[400, 401, 409, 413, 415, 429, 500, 502, 503]),
        "volume.get" => Op::new("Show a volume", "volumes")
            .param("VolumeName")
            .ok(200, "The volume.", vec![("application/json", s::<sh::Volume>(g))])
            .err(&[400, 401, 404, 500]),
        "volume.delete" => Op::new("Delete a volume and its files", "volumes")
            .param("VolumeName")
            .ok(204, "Deleted.", vec![])
            .err(&[400, 401, 404, 409, 500, 502, 503]),
        "volume_files.download" => Op::new("Read a file of a volume", "volumes")
            .param("VolumeName")
            .param("VolumeFilePath")
            .ok(200, "The file's bytes.", vec![("application/octet-stream", json!({"type": "string", "contentMediaType": "application/octet-stream"}))])
            .err(&[400, 401, 404, 409, 413, 500, 502, 503]),
        "volume_files.upload" => Op::new("Write a file of a volume", "volumes")
            .desc("The file is replaced whole: a write that fails (a full volume: 507) leaves the old file.")
            .param("VolumeName")
            .param("VolumeTargetPath")
            .param_inline(json!({"name": "mode", "in": "query", "required": false, "schema": {"type": "string", "pattern": "^0?[0-7]{1,4}$"}, "description": "Octal permission bits (default 0644)."}))
            .param_inline(json!({"name": "parents", "in": "query", "required": false, "schema": {"type": "boolean", "default": false}, "description": "Make missing parent directories."}))
            .body(false, vec![("application/octet-stream", json!({"type": "string", "contentMediaType": "application/octet-stream"}))])
            .ok(200, "The file.", vec![("application/json", s::<sh::FileStat>(g))])
            .err(&[400, 401, 404, 409, 413, 500, 502, 503, 507]),
        "volume_files.remove" => Op::new("Remove a file or directory of a volume", "volumes")
            .desc("A directory goes with everything in it.")
            .param("VolumeName")
            .param("VolumeTargetPath")
            .ok(204, "Removed.", vec![])
            .err(&[400, 401, 404, 409, 500, 502, 503]),
        "volume_files.list" => Op::new("List a directory of a volume", "volumes")
            .param("VolumeName")
            .param("VolumeFilePath")
            .ok(200, "Entries sorted by name.", vec![("application/json", s::<sh::DirListing>(g))])
            .err(&[400, 401, 404, 409, 500, 502, 503]),
        "volume_files.stat" => Op::new("Describe a path of a volume", "volumes")
            .param("VolumeName")
            .param("VolumeFilePath")
            .ok(200, "The path (a symlink is reported as one).", vec![("application/json", s::<sh::FileStat>(g))])
            .err(&[400, 401, 404, 409, 500, 502, 503]),
        "volume_files.mkdir" => Op::new("Make a directory in a volume", "volumes")
            .param("VolumeName")
            .body(true, vec![("application/json", s::<sh::VolumeMkdirRequest>(g))])
            .ok(200, "The directory.", vec![("application/json", s::<sh::FileStat>(g))])
            .err(&[400, 401, 404, 409, 413, 415, 500, 502, 503, 507]),
        "volume_files.rename" => Op::new("Rename a path of a volume", "volumes")
            .param("VolumeName")
            .body(true, vec![("application/json", s::<sh::VolumeRenameRequest>(g))])
            .ok(200, "The renamed path.", vec![("application/json", s::<sh::FileStat>(g))])
            .err(&[400, 401, 404, 409, 413, 415, 500, 502, 503]),
        "snapshot.list" => Op::new("List a sandbox's snapshots", "snapshots")
            .param("SandboxId")
            .ok(200, "Oldest first.", vec![("application/json", s::<sh::SnapshotList>(g))])
            .err(&[400, 401, 404, 500]),
        "snapshot.create" => Op::new("Take a snapshot", "snapshots")
            .desc("Without a body, a disk snapshot.")
            .param("SandboxId")
            .body(false, vec![("application/json", s::<crate::api::sandboxes::SnapshotBody>(g))])
            .ok(201, "The snapshot.", vec![("application/json", s::<sh::Snapshot>(g))])
            .err(&[400, 401, 404, 409, 413, 415, 500, 502]),
        "snapshot.rollback" => Op::new("Roll back to a snapshot", "snapshots")
            .param("SandboxId")
            .body(true, vec![("application/json", s::<crate::api::sandboxes::RollbackBody>(g))])
            .ok(200, "The sandbox, running from the snapshot.", vec![("application/json", s::<sh::Sandbox>(g))])
            .err(&[400, 401, 404, 409, 413, 415, 500, 502, 503]),
        "audit.list" => Op::new("Audit events", "audit")
            .desc("A tenant key sees its tenant's events; an admin key sees every event, including authentication failures with no known tenant.")
            .query::<crate::api::admin::AuditQuery>(g)
            .ok(200, "Newest first.", vec![("application/json", s::<sh::AuditList>(g))])
            .err(&[400, 401, 500]),
        "tenant.list" => Op::new("List tenants (admin)", "tenants")
            .ok(200, "Every tenant.", vec![("application/json", s::<sh::TenantList>(g))])
            .err(&[401, 403, 500]),
        "tenant.create" => Op::new("Create a tenant (admin)", "tenants")
            .body(true, vec![("application/json", s::<crate::api::admin::CreateTenantBody>(g))])
            .ok(201, "The tenant and its first, non-admin key.", vec![("application/json", s::<sh::TenantCreated>(g))])
            .err(&[400, 401, 403, 409, 413, 415, 500]),
        "tenant.update" => Op::new("Change a tenant's quotas (admin)", "tenants")
            .param("TenantName")
            .body(true, vec![("application/json", s::<crate::api::admin::UpdateTenantBody>(g))])
            .ok(200, "The tenant.", vec![("application/json", s::<sh::Tenant>(g))])
            .err(&[400, 401, 403, 404, 413, 415, 500]),
        "key.list" => Op::new("List a tenant's keys (admin)", "tenants")
            .param("TenantName")
            .ok(200, "Every key of the tenant, revoked ones included; never a secret.", vec![("application/json", s::<sh::KeyList>(g))])
            .err(&[400, 401, 403, 404, 500]),
        "key.create" => Op::new("Make a key (admin)", "tenants")
            .param("TenantName")
            .body(false, vec![("application/json", s::<crate::api::admin::CreateKeyBody>(g))])
            .ok(201, "The key; the only time the secret is shown.", vec![("application/json", s::<sh::KeyCreated>(g))])
            .err(&[400, 401, 403, 404, 413, 415, 500]),
        "key.revoke" => Op::new("Revoke a key (admin)", "tenants")
            .param("KeyId")
            .ok(204, "Revoked (revoking again changes nothing).", vec![])
            .err(&[400, 401, 403, 404, 500]),
        "secret.list" => Op::new("List the tenant's secrets (never their values)", "secrets")
            .ok(200, "The secrets, by name.", vec![("application/json", s::<sh::SecretList>(g))])
            .err(&[401, 500]),
        "secret.set" => Op::new("Set or replace a secret", "secrets")
            .param("SecretName")
            .body(true, vec![("application/json", s::<crate::api::net::SecretBody>(g))])
            .ok(201, "Created.", vec![("application/json", s::<sh::Secret>(g))])
            .ok(200, "Replaced (the creation time stays).", vec![("application/json", s::<sh::Secret>(g))])
            .err(&[400, 401, 404, 413, 415, 500]),
        "secret.delete" => Op::new("Delete a secret", "secrets")
            .param("SecretName")
            .ok(204, "Deleted. Sandboxes bound to it reach its hosts without the value from now on.", vec![])
            .err(&[400, 401, 404, 500]),
        "egress.get" => Op::new("A sandbox's egress policy", "egress")
            .param("SandboxId")
            .ok(200, "The policy.", vec![("application/json", s::<sh::EgressPolicy>(g))])
            .err(&[400, 401, 404, 500]),
        "egress.update" => Op::new("Replace a sandbox's egress policy (new connections use it at once)", "egress")
            .param("SandboxId")
            .body(true, vec![("application/json", s::<sh::EgressPolicy>(g))])
            .ok(200, "The policy in effect.", vec![("application/json", s::<sh::EgressPolicy>(g))])
            .err(&[400, 401, 404, 409, 413, 415, 500]),
        "browser.start" => Op::new("Start the sandbox's browser (Chromium) and get its DevTools and live-view URLs", "browser")
            .desc("Starts Chromium unless it runs: on the desktop's display when an X server runs there (the `desktop` template after its SDK or `DISPLAY` started one), headless otherwise; its profile is on the sandbox's disk, so logins live with the sandbox. `cdp_url` works as is with Playwright's `connect_over_cdp` and Puppeteer's `connect` (a token good for an hour is in its query; the key header works too); `live_url` is the noVNC view of the display, its token in the path. The sandbox's template must have Chromium (`desktop`): else `409 illegal_state`.")
            .param("SandboxId")
            .ok(200, "The URLs.", vec![("application/json", s::<sh::BrowserSession>(g))])
            .err(&[400, 401, 404, 409, 500, 502, 503]),
        "browser.cdp" => Op::new("The browser's DevTools WebSocket (CDP)", "browser")
            .desc("Upgrades to a WebSocket to the browser's DevTools, whatever its current path in the guest (a restarted browser keeps the URL). Authenticated by the key header or by the URL's `token`. `409 illegal_state` when the browser does not run.")
            .param("SandboxId")
            .param("BrowserQueryToken")
            .ok(101, "Switching Protocols: the DevTools WebSocket is open.", vec![])
            .err(&[400, 401, 404, 409, 500, 502]),
        "browser.fill" => Op::new("Type a credential into a field of the sandbox's browser", "browser")
            .desc("Fills the field `selector` of the page in front with the secret's placeholder (the default): the gateway puts the value in when the form is sent to a host the secret is bound to, so the value never enters the VM. `mode: value` types the value itself (the current code for a TOTP secret) for pages whose script hashes or encrypts the field; it does so only when the page is https on a bound host (`403 forbidden` otherwise), and the value then is in the VM. Audited as `credential.fill`. The browser must run and have a page with a matching element (`409 illegal_state`); the sandbox must have the secret bound (`404 secret_not_found`).")
            .param("SandboxId")
            .body(true, vec![("application/json", s::<sh::BrowserFillRequest>(g))])
            .ok(200, "What was filled (never the value).", vec![("application/json", s::<sh::BrowserFill>(g))])
            .err(&[400, 401, 403, 404, 409, 413, 415, 500, 502]),
        "browser.live" => Op::new("The live view of the sandbox's display (noVNC)", "browser")
            .desc("noVNC's page, its files and its WebSocket, reached with the token of the `live_url` that `POST .../browser` answered (no key); a wrong or expired token is `404 not_found`.")
            .public()
            .param("SandboxId")
            .param("BrowserToken")
            .param("ProxyPath")
            .ok(200, "What noVNC answers (101 for its WebSocket).", vec![("*/*", json!({}))])
            .err(&[400, 404, 409, 500, 502]),
        "port.expose" => Op::new("Expose a port at a URL (a port exposed already gets a new URL)", "ingress")
            .param("SandboxId")
            .body(true, vec![("application/json", s::<crate::api::net::ExposeBody>(g))])
            .ok(201, "The URL, shown only this once.", vec![("application/json", s::<sh::PortExposed>(g))])
            .err(&[400, 401, 404, 409, 413, 415, 500]),
        "port.list" => Op::new("List the exposed ports", "ingress")
            .param("SandboxId")
            .ok(200, "The ports, by number.", vec![("application/json", s::<sh::PortList>(g))])
            .err(&[400, 401, 404, 500]),
        "port.unexpose" => Op::new("Revoke the URL of an exposed port", "ingress")
            .param("SandboxId")
            .param("Port")
            .ok(204, "Revoked.", vec![])
            .err(&[400, 401, 404, 500]),
        "port.proxy_get" => Op::new("Reach a port of the sandbox with the tenant's key, exposed or not (GET)", "ingress")
            .param("SandboxId")
            .param("Port")
            .param("ProxyPath")
            .ok(200, "Whatever the app inside answers (any status; 101 for a WebSocket upgrade).", vec![("*/*", json!({}))])
            .err(&[400, 404, 409, 500, 502, 401]),
        "port.proxy_post" => Op::new("Reach a port of the sandbox with the tenant's key, exposed or not (POST)", "ingress")
            .param("SandboxId")
            .param("Port")
            .param("ProxyPath")
            .body(false, vec![("*/*", json!({}))])
            .ok(200, "Whatever the app inside answers (any status; 101 for a WebSocket upgrade).", vec![("*/*", json!({}))])
            .err(&[400, 404, 409, 500, 502, 401, 413]),
        "port.proxy_put" => Op::new("Reach a port of the sandbox with the tenant's key, exposed or not (PUT)", "ingress")
            .param("SandboxId")
            .param("Port")
            .param("ProxyPath")
            .body(false, vec![("*/*", json!({}))])
            .ok(200, "Whatever the app inside answers (any status; 101 for a WebSocket upgrade).", vec![("*/*", json!({}))])
            .err(&[400, 404, 409, 500, 502, 401, 413]),
        "port.proxy_patch" => Op::new("Reach a port of the sandbox with the tenant's key, exposed or not (PATCH)", "ingress")
            .param("SandboxId")
            .param("Port")
            .param("ProxyPath")
            .body(false, vec![("*/*", json!({}))])
            .ok(200, "Whatever the app inside answers (any status; 101 for a WebSocket upgrade).", vec![("*/*", json!({}))])
            .err(&[400, 404, 409, 500, 502, 401, 413]),
        "port.proxy_delete" => Op::new("Reach a port of the sandbox with the tenant's key, exposed or not (DELETE)", "ingress")
            .param("SandboxId")
            .param("Port")
            .param("ProxyPath")
            .ok(200, "Whatever the app inside answers (any status; 101 for a WebSocket upgrade).", vec![("*/*", json!({}))])
            .err(&[400, 404, 409, 500, 502, 401]),
        "ingress.get" => Op::new("Reach an exposed port through its URL (no key: the token is the credential) (GET)", "ingress")
            .public()
            .param("IngressToken")
            .param("ProxyPath")
            .ok(200, "Whatever the app inside answers (any status; 101 for a WebSocket upgrade).", vec![("*/*", json!({}))])
            .err(&[400, 404, 409, 500, 502]),
        "ingress.post" => Op::new("Reach an exposed port through its URL (no key: the token is the credential) (POST)", "ingress")
            .public()
            .param("IngressToken")
            .param("ProxyPath")
            .body(false, vec![("*/*", json!({}))])
            .ok(200, "Whatever the app inside answers (any status; 101 for a WebSocket upgrade).", vec![("*/*", json!({}))])
            .err(&[400, 404, 409, 500, 502, 413]),
        "ingress.put" => Op::new("Reach an exposed port through its URL (no key: the token is the credential) (PUT)", "ingress")
            .public()
            .param("IngressToken")
            .param("ProxyPath")
            .body(false, vec![("*/*", json!({}))])
            .ok(200, "Whatever the app inside answers (any status; 101 for a WebSocket upgrade).", vec![("*/*", json!({}))])
            .err(&[400, 404, 409, 500, 502, 413]),
        "ingress.patch" => Op::new("Reach an exposed port through its URL (no key: the token is the credential) (PATCH)", "ingress")
            .public()
            .param("IngressToken")
            .param("ProxyPath")
            .body(false, vec![("*/*", json!({}))])
            .ok(200, "Whatever the app inside answers (any status; 101 for a WebSocket upgrade).", vec![("*/*", json!({}))])
            .err(&[400, 404, 409, 500, 502, 413]),
        "ingress.delete" => Op::new("Reach an exposed port through its URL (no key: the token is the credential) (DELETE)", "ingress")
            .public()
            .param("IngressToken")
            .param("ProxyPath")
            .ok(200, "Whatever the app inside answers (any status; 101 for a WebSocket upgrade).", vec![("*/*", json!({}))])
            .err(&[400, 404, 409, 500, 502]),
        "tenant.master_key.get" => Op::new("A tenant's master key (admin)", "tenants")
            .param("TenantName")
            .ok(200, "The tenant's master key.", vec![("application/json", s::<sh::MasterKey>(g))])
            .err(&[400, 401, 403, 404, 500, 409]),
        "tenant.master_key.set" => Op::new("Set a tenant's master key (admin): rewraps the tenant key, no data rewritten", "tenants")
            .param("TenantName")
            .body(true, vec![("application/json", s::<sh::MasterKeySetRequest>(g))])
            .ok(200, "The new master key.", vec![("application/json", s::<sh::MasterKey>(g))])
            .err_ref(502, "BadGateway")
            .err(&[400, 401, 403, 404, 500, 409, 413, 415]),
        "node.token" => Op::new("Make a one-time join token for a node (admin)", "cluster")
            .body(false, vec![("application/json", s::<crate::api::cluster::TokenBody>(g))])
            .ok(201, "The token, shown once.", vec![("application/json", s::<sh::JoinToken>(g))])
            .err(&[400, 401, 403, 404, 413, 415, 500]),
        "node.join" => Op::new("A node joins with a join token (nodes call this)", "cluster")
            .public()
            .body(true, vec![("application/json", s::<sh::NodeJoinRequest>(g))])
            .ok(200, "The node's certificate, the cluster CA, its incarnation and secret.", vec![("application/json", s::<sh::NodeMembership>(g))])
            .err(&[400, 401, 404, 413, 415, 500]),
        "node.rejoin" => Op::new("A member comes back as a new incarnation (nodes call this)", "cluster")
            .public()
            .body(true, vec![("application/json", s::<sh::NodeRejoinRequest>(g))])
            .ok(200, "A fresh certificate and the new incarnation.", vec![("application/json", s::<sh::NodeMembership>(g))])
            .err(&[400, 401, 404, 413, 415, 500]),
        "node.heartbeat" => Op::new("A node renews its lease (nodes call this)", "cluster")
            .public()
            .body(true, vec![("application/json", s::<sh::NodeHeartbeatRequest>(g))])
            .ok(200, "The lease was renewed.", vec![("application/json", s::<sh::NodeLease>(g))])
            .err(&[400, 404, 409, 413, 415, 500]),
        "node.claim" => Op::new("A node claims work one node of the cluster does once (nodes call this)", "cluster")
            .public()
            .body(true, vec![("application/json", s::<sh::NodeClaimRequest>(g))])
            .ok(200, "Whether the node holds the claim now.", vec![("application/json", s::<sh::NodeClaim>(g))])
            .err(&[400, 404, 409, 413, 415, 500]),
        "node.audit" => Op::new("A node delivers its gateway's audit events (nodes call this)", "cluster")
            .desc("At most 500 events, oldest first, recorded at the time they happened in one transaction; an event of no gateway operation is left out. A node sends a batch again when its answer is lost (at least once).")
            .public()
            .body(true, vec![("application/json", s::<sh::NodeAuditRequest>(g))])
            .ok(200, "The events are in the audit log.", vec![("application/json", s::<sh::NodeAudit>(g))])
            .err(&[400, 404, 409, 413, 415, 500]),
        "node.list" => Op::new("List the cluster's nodes (admin)", "cluster")
            .ok(200, "Every node ever joined.", vec![("application/json", s::<sh::NodeList>(g))])
            .err(&[401, 403, 404, 500]),
        "node.drain" => Op::new("Stop placing sandboxes on a node (admin)", "cluster")
            .param("NodeId")
            .ok(200, "The node, now draining.", vec![("application/json", s::<sh::Node>(g))])
            .err(&[400, 401, 403, 404, 500]),
        "node.remove" => Op::new("Take a node out of the cluster (admin)", "cluster")
            .param("NodeId")
            .ok(200, "The node, now removed.", vec![("application/json", s::<sh::Node>(g))])
            .err(&[400, 401, 403, 404, 500]),
        "template.upload" => Op::new("Upload a build context or an image archive", "templates")
            .body(false, vec![("application/octet-stream", json!({"type": "string", "format": "binary"}))])
            .ok(201, "The upload.", vec![("application/json", s::<sh::Upload>(g))])
            .err(&[400, 401, 409, 413, 500]),
        "template.builds" => Op::new("The caller's template builds, newest first", "templates")
            .ok(200, "Builds.", vec![("application/json", s::<sh::BuildList>(g))])
            .err(&[401, 500]),
        "template.build_get" => Op::new("One build", "templates")
            .param("BuildId")
            .ok(200, "The build.", vec![("application/json", s::<sh::Build>(g))])
            .err(&[400, 401, 404, 500]),
        "template.build_log" => Op::new("A build's log (text); with follow=true it streams until the build ends", "templates")
            .param("BuildId")
            .query::<crate::api::templates::LogQuery>(g)
            .ok(200, "The log.", vec![("text/plain", json!({"type": "string"}))])
            .err(&[400, 401, 404, 500]),
        "template.save" => Op::new("Make a template of a running sandbox, its processes included", "templates")
            .param("SandboxId")
            .body(true, vec![("application/json", s::<crate::api::templates::SaveBody>(g))])
            .ok(201, "The template.", vec![("application/json", s::<sh::Template>(g))])
            .err(&[400, 401, 403, 404, 409, 500, 502, 503, 413, 415]),
        "mcp.post" => Op::new("MCP request (Streamable HTTP)", "mcp")
            .desc("A JSON-RPC message of the Model Context Protocol: the sandbox tools of `docs/mcp.md`, scoped to the key's tenant. Each tool call is an API call with this request's key.")
            .ok(200, "A JSON-RPC answer (`application/json`) or an SSE stream of JSON-RPC messages (`text/event-stream`), as the Streamable HTTP transport of MCP says (a notification is answered `202` with no body; a malformed JSON-RPC message is answered by the MCP layer with a JSON-RPC error).", vec![("application/json", json!({"type": "object"})), ("text/event-stream", json!({"type": "string"}))])
            .err(&[401, 500])
            .mcp_transport_refusals(),
        "mcp.get" => Op::new("MCP server-to-client stream", "mcp")
            .desc("The SSE stream of a session (protocol versions before 2026-07-28).")
            .ok(200, "A JSON-RPC answer (`application/json`) or an SSE stream of JSON-RPC messages (`text/event-stream`), as the Streamable HTTP transport of MCP says (a notification is answered `202` with no body; a malformed JSON-RPC message is answered by the MCP layer with a JSON-RPC error).", vec![("application/json", json!({"type": "object"})), ("text/event-stream", json!({"type": "string"}))])
            .err(&[401, 500])
            .mcp_transport_refusals(),
        "mcp.delete" => Op::new("End an MCP session", "mcp")
            .desc("Ends a session (protocol versions before 2026-07-28).")
            .ok(200, "A JSON-RPC answer (`application/json`) or an SSE stream of JSON-RPC messages (`text/event-stream`), as the Streamable HTTP transport of MCP says (a notification is answered `202` with no body; a malformed JSON-RPC message is answered by the MCP layer with a JSON-RPC error).", vec![("application/json", json!({"type": "object"})), ("text/event-stream", json!({"type": "string"}))])
            .err(&[401, 500])
            .mcp_transport_refusals(),
        other => panic!("operation {other} of ROUTES is not described"),
    }
}
