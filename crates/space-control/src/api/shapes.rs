//! The schemas of the API document that no Rust type of this crate derives: answers the
//! handlers build as JSON, and types of other crates (`space_node`, `space_proto`) that are
//! serialized as they are. Each is a type implementing [`schemars::JsonSchema`] by hand, so
//! operations and derived schemas name them like any other type.

use schemars::JsonSchema;

/// A schema written out: `shape!(Name [Dependency, ...], { JSON Schema })`; the
/// dependencies are the shapes its `$ref`s name, so they are put in the document with it.
macro_rules! shape {
    ($name:ident [$($dep:ident),*], $schema:tt) => {
        #[doc = concat!("The `", stringify!($name), "` schema.")]
        pub struct $name;
        impl JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_g: &mut schemars::SchemaGenerator) -> schemars::Schema {
                $( _g.subschema_for::<$dep>(); )*
                schemars::json_schema!($schema)
            }
        }
    };
}

shape!(AuditEvent [Name], {"type": "object", "required": ["id", "at_unix_ms", "tenant", "key_id", "sandbox", "operation", "result", "detail"], "properties": {"id": {"type": "integer", "format": "int64"}, "at_unix_ms": {"type": "integer", "format": "int64", "minimum": 0}, "tenant": {"oneOf": [{"$ref": "#/components/schemas/Name"}, {"type": "null"}]}, "key_id": {"oneOf": [{"type": "string"}, {"type": "null"}]}, "sandbox": {"oneOf": [{"type": "string"}, {"type": "null"}]}, "operation": {"type": "string", "examples": ["sandbox.create", "auth"]}, "result": {"type": "string", "description": "`ok` or the error code."}, "detail": {"oneOf": [{"type": "string", "maxLength": 4096}, {"type": "null"}]}}});

shape!(AuditList [AuditEvent], {"type": "object", "required": ["events"], "properties": {"events": {"type": "array", "items": {"$ref": "#/components/schemas/AuditEvent"}}}});

shape!(DirEntry [FileStat], {"type": "object", "required": ["name", "stat"], "properties": {"name": {"type": "string"}, "stat": {"$ref": "#/components/schemas/FileStat"}}});

shape!(DirListing [DirEntry], {"type": "object", "required": ["entries"], "properties": {"entries": {"type": "array", "items": {"$ref": "#/components/schemas/DirEntry"}}}});

shape!(Error [], {"type": "object", "description": "The body of every error response.", "required": ["error"], "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {"code": {"type": "string", "description": "Stable; scripts match on it.", "examples": ["invalid_request", "invalid_json", "invalid_id", "unauthorized", "forbidden", "sandbox_not_found", "snapshot_not_found", "template_not_found", "tenant_not_found", "key_not_found", "file_not_found", "route_not_found", "method_not_allowed", "illegal_state", "conflict", "payload_too_large", "unsupported_media_type", "quota_exceeded", "guest_error", "capacity", "disk_full", "shutting_down", "internal", "secret_not_found", "port_not_found", "build_not_found", "node_not_found", "not_found", "not_a_cluster", "create_in_progress", "idempotency_key_reused", "key_unavailable", "archive_unavailable", "node_unavailable", "quota_busy", "stale_incarnation"]}, "message": {"type": "string", "description": "For people; may change."}}}}});

shape!(ExecEvent [ExecExit, ExecOutput, ExecStarted, StreamError], {"description": "One line of an exec stream; `exit` or `error` is the last.", "oneOf": [{"$ref": "#/components/schemas/ExecStarted"}, {"$ref": "#/components/schemas/ExecOutput"}, {"$ref": "#/components/schemas/ExecExit"}, {"$ref": "#/components/schemas/StreamError"}], "discriminator": {"propertyName": "type", "mapping": {"started": "#/components/schemas/ExecStarted", "stdout": "#/components/schemas/ExecOutput", "stderr": "#/components/schemas/ExecOutput", "exit": "#/components/schemas/ExecExit", "error": "#/components/schemas/StreamError"}}});

shape!(ExecExit [], {"type": "object", "required": ["type", "exit_code", "signal"], "properties": {"type": {"const": "exit"}, "exit_code": {"oneOf": [{"type": "integer"}, {"type": "null"}]}, "signal": {"oneOf": [{"type": "integer"}, {"type": "null"}]}}});

shape!(ExecOutput [], {"type": "object", "required": ["type", "data"], "properties": {"type": {"enum": ["stdout", "stderr"]}, "data": {"type": "string", "contentEncoding": "base64"}}});

shape!(ExecRequest [], {"type": "object", "additionalProperties": false, "description": "Exactly one of `cmd` (argv) or `shell` (a line for /bin/sh -c).", "properties": {"cmd": {"oneOf": [{"type": "array", "items": {"type": "string", "pattern": "^[^\\u0000]*$"}, "prefixItems": [{"type": "string", "minLength": 1, "pattern": "^[^\\u0000]*$"}], "minItems": 1}, {"type": "null"}]}, "shell": {"oneOf": [{"type": "string", "pattern": "^[^\\u0000]*$"}, {"type": "null"}]}, "env": {"type": "object", "propertyNames": {"minLength": 1, "pattern": "^[^=\\u0000]+$"}, "additionalProperties": {"type": "string", "pattern": "^[^\\u0000]*$"}}, "cwd": {"oneOf": [{"type": "string", "pattern": "^/[^\\u0000]*$", "maxLength": 4096, "description": "An absolute path in the guest."}, {"type": "null"}]}, "stdin": {"oneOf": [{"type": "string", "contentEncoding": "base64", "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$", "description": "Written, then closed (standard base64, padded); left out: stdin is empty."}, {"type": "null"}]}, "timeout_ms": {"oneOf": [{"type": "integer", "format": "uint64", "minimum": 1}, {"type": "null"}]}}, "oneOf": [{"required": ["cmd"], "properties": {"cmd": {"type": "array"}}}, {"required": ["shell"], "properties": {"shell": {"type": "string"}}}]});

shape!(ExecStarted [], {"type": "object", "required": ["type", "pid"], "properties": {"type": {"const": "started"}, "pid": {"type": "integer", "minimum": 0}}});

shape!(ExecWsClientMessage [], {"description": "Text frames from the client after the first (an ExecRequest); binary frames are stdin.", "oneOf": [{"type": "object", "required": ["type"], "properties": {"type": {"const": "eof"}}}, {"type": "object", "required": ["type", "signal"], "properties": {"type": {"const": "signal"}, "signal": {"type": "integer", "minimum": 1}}}]});

shape!(FileStat [], {"type": "object", "required": ["path", "file_type", "size", "mode", "uid", "gid", "mtime_unix_ns", "symlink_target"], "properties": {"path": {"type": "string"}, "file_type": {"type": "string", "enum": ["file", "dir", "symlink", "other"]}, "size": {"type": "integer", "minimum": 0}, "mode": {"type": "integer", "minimum": 0, "maximum": 4095, "description": "Permission bits (0o7777 mask)."}, "uid": {"type": "integer", "minimum": 0}, "gid": {"type": "integer", "minimum": 0}, "mtime_unix_ns": {"type": "integer", "format": "int64"}, "symlink_target": {"oneOf": [{"type": "string"}, {"type": "null"}]}, "xattrs": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Extended attributes in the user. namespace with UTF-8 values (at most 32); absent when there are none."}}});

shape!(ForkedFrom [SandboxId], {"type": "object", "required": ["sandbox", "snapshot"], "properties": {"sandbox": {"$ref": "#/components/schemas/SandboxId"}, "snapshot": {"type": "string"}}});

shape!(Health [], {"type": "object", "required": ["status", "version", "accelerator"], "properties": {"status": {"type": "string", "const": "ok"}, "version": {"type": "string", "examples": ["0.1.0"]}, "accelerator": {"type": "string", "enum": ["kvm", "tcg"]}}});

shape!(Key [KeyId, Name], {"type": "object", "required": ["id", "tenant", "admin", "label", "created_unix_ms", "revoked_unix_ms"], "properties": {"id": {"$ref": "#/components/schemas/KeyId"}, "tenant": {"$ref": "#/components/schemas/Name"}, "admin": {"type": "boolean"}, "label": {"oneOf": [{"type": "string", "maxLength": 200}, {"type": "null"}]}, "created_unix_ms": {"type": "integer", "format": "int64", "minimum": 0}, "revoked_unix_ms": {"oneOf": [{"type": "integer", "format": "int64", "minimum": 0}, {"type": "null"}]}}});

shape!(KeyCreated [Key], {"description": "A Key plus the whole key, shown only this once.", "allOf": [{"$ref": "#/components/schemas/Key"}, {"type": "object", "required": ["key"], "properties": {"key": {"type": "string", "pattern": "^space_k[a-z0-9]{15}_[A-Za-z0-9]{32}$"}}}]});

shape!(KeyId [], {"type": "string", "pattern": "^k[a-z0-9]{15}$"});

shape!(KeyList [Key], {"type": "object", "required": ["keys"], "properties": {"keys": {"type": "array", "items": {"$ref": "#/components/schemas/Key"}}}});

shape!(MkdirRequest [], {"type": "object", "required": ["path"], "additionalProperties": false, "properties": {"path": {"type": "string", "pattern": "^/[^\\u0000]*$", "maxLength": 4096, "description": "An absolute path in the guest."}, "parents": {"type": "boolean", "default": true}}});

shape!(Name [], {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,39}$", "description": "A tenant or template name."});

shape!(PtyRequest [], {"type": "object", "required": ["rows", "cols"], "additionalProperties": false, "description": "The client's first message on the PTY WebSocket.", "properties": {"rows": {"type": "integer", "minimum": 1, "maximum": 65535}, "cols": {"type": "integer", "minimum": 1, "maximum": 65535}, "cmd": {"oneOf": [{"type": "array", "items": {"type": "string", "pattern": "^[^\\u0000]*$"}, "prefixItems": [{"type": "string", "minLength": 1, "pattern": "^[^\\u0000]*$"}], "minItems": 1, "description": "null: a login shell"}, {"type": "null"}]}, "env": {"type": "object", "propertyNames": {"minLength": 1, "pattern": "^[^=\\u0000]+$"}, "additionalProperties": {"type": "string", "pattern": "^[^\\u0000]*$"}}, "cwd": {"oneOf": [{"type": "string", "pattern": "^/[^\\u0000]*$", "maxLength": 4096, "description": "An absolute path in the guest."}, {"type": "null"}]}}});

shape!(PtyResize [], {"type": "object", "required": ["type", "rows", "cols"], "properties": {"type": {"const": "resize"}, "rows": {"type": "integer", "minimum": 1, "maximum": 65535}, "cols": {"type": "integer", "minimum": 1, "maximum": 65535}}});

shape!(Quotas [], {"type": "object", "required": ["max_sandboxes", "max_vcpus", "max_memory_mib", "max_suspended_ms"], "additionalProperties": false, "properties": {"max_sandboxes": {"type": "integer", "minimum": 0, "maximum": 4294967295u64, "default": 100}, "max_vcpus": {"type": "integer", "minimum": 0, "maximum": 4294967295u64, "default": 64}, "max_memory_mib": {"type": "integer", "minimum": 0, "format": "int64", "default": 65536}, "max_suspended_ms": {"type": ["integer", "null"], "minimum": 0, "description": "How long a sandbox of the tenant may stay suspended before it is killed (audited as sandbox.expire), in ms; null: forever. In an update, null lifts the limit and leaving it out keeps it."}}});

shape!(RenameRequest [], {"type": "object", "required": ["from", "to"], "additionalProperties": false, "properties": {"from": {"type": "string", "pattern": "^/[^\\u0000]*$", "maxLength": 4096, "description": "An absolute path in the guest."}, "to": {"type": "string", "pattern": "^/[^\\u0000]*$", "maxLength": 4096, "description": "An absolute path in the guest."}}});

shape!(Sandbox [EgressPolicy, ForkedFrom, Name, SandboxId, SandboxState, SecretBindingInfo, Timeouts], {"type": "object", "required": ["id", "tenant", "template", "template_version", "state", "vcpus", "memory_mib", "disk_mib", "env", "metadata", "timeouts", "forked_from", "failure", "created_unix_ms", "state_since_unix_ms", "last_activity_unix_ms", "egress", "secrets", "auto_resume", "restore_point"], "properties": {"id": {"$ref": "#/components/schemas/SandboxId"}, "tenant": {"$ref": "#/components/schemas/Name"}, "template": {"$ref": "#/components/schemas/Name"}, "template_version": {"type": "string"}, "state": {"$ref": "#/components/schemas/SandboxState"}, "vcpus": {"type": "integer", "minimum": 1}, "memory_mib": {"type": "integer", "minimum": 1}, "disk_mib": {"type": "integer", "minimum": 1}, "env": {"type": "object", "additionalProperties": {"type": "string"}}, "metadata": {"type": "object", "additionalProperties": {"type": "string"}}, "timeouts": {"$ref": "#/components/schemas/Timeouts"}, "forked_from": {"oneOf": [{"$ref": "#/components/schemas/ForkedFrom"}, {"type": "null"}]}, "failure": {"oneOf": [{"type": "string"}, {"type": "null"}]}, "created_unix_ms": {"type": "integer", "format": "int64", "minimum": 0}, "state_since_unix_ms": {"type": "integer", "format": "int64", "minimum": 0}, "last_activity_unix_ms": {"type": "integer", "format": "int64", "minimum": 0}, "egress": {"$ref": "#/components/schemas/EgressPolicy"}, "secrets": {"type": "array", "items": {"$ref": "#/components/schemas/SecretBindingInfo"}}, "auto_resume": {"type": "boolean", "description": "Whether guest access (exec, files, terminals, watch, ports, ingress) to a paused sandbox resumes it and to a suspended one restores it."}, "node": {"type": "string", "description": "The cluster node that holds the sandbox; only in answers to admin keys, and only in a cluster."}, "restore_point": {"type": ["object", "null"], "description": "For a suspended sandbox: the snapshot a restore starts from, and where it lives (`local`, `remote` (the object store only), `local+remote`).", "required": ["snapshot", "location"], "properties": {"snapshot": {"type": "string"}, "location": {"type": "string", "enum": ["local", "remote", "local+remote", "lost"]}}}}});

shape!(SandboxId [], {"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,63}$", "description": "`sbx-` and 16 hex digits when the node makes one; any id the node accepts is at most 64 lowercase letters, digits, `.`, `_` and `-`, starting with a letter or digit.", "examples": ["sbx-0123456789abcdef"]});

shape!(SandboxList [Sandbox], {"type": "object", "required": ["sandboxes"], "properties": {"sandboxes": {"type": "array", "items": {"$ref": "#/components/schemas/Sandbox"}}}});

shape!(SandboxState [], {"type": "string", "enum": ["creating", "running", "paused", "suspended", "failed", "terminated"]});

shape!(Snapshot [], {"type": "object", "required": ["id", "kind", "reason", "created_unix_ms", "size_bytes", "paused_for_us", "local"], "properties": {"id": {"type": "string"}, "kind": {"type": "string", "enum": ["disk", "full"]}, "reason": {"type": "string", "enum": ["request", "suspend", "fork", "pre_rollback", "rolling"]}, "created_unix_ms": {"type": "integer", "format": "int64", "minimum": 0}, "size_bytes": {"type": "integer", "minimum": 0}, "paused_for_us": {"type": "integer", "minimum": 0}, "local": {"type": "boolean", "description": "Whether the snapshot's files are on the node's disk (false once the local copy was evicted, or for a snapshot known only from the object store)."}, "remote": {"type": ["object", "null"], "description": "The snapshot's copy in the object store, once uploaded.", "required": ["manifest_hash", "uploaded_unix_ms", "uploaded_bytes", "new_chunks", "stored_bytes"], "properties": {"manifest_hash": {"type": "string", "description": "BLAKE3 of the manifest object, checked before the manifest is used."}, "uploaded_unix_ms": {"type": "integer", "format": "int64", "minimum": 0}, "uploaded_bytes": {"type": "integer", "minimum": 0, "description": "Bytes the upload wrote: new chunks and the manifest."}, "new_chunks": {"type": "integer", "minimum": 0}, "stored_bytes": {"type": "integer", "minimum": 0, "description": "Bytes of every chunk the manifest references, shared or not."}}}}});

shape!(SnapshotList [Snapshot], {"type": "object", "required": ["snapshots"], "properties": {"snapshots": {"type": "array", "items": {"$ref": "#/components/schemas/Snapshot"}}}});

shape!(StreamError [], {"type": "object", "required": ["type", "code", "message"], "properties": {"type": {"const": "error"}, "code": {"type": "string"}, "message": {"type": "string"}}});

shape!(Template [Name], {"type": "object", "required": ["name", "version", "vcpus", "memory_mib", "image_mib", "image", "created_unix_ms", "source", "owner", "env", "user", "workdir", "command", "ports", "start"], "properties": {"name": {"$ref": "#/components/schemas/Name"}, "version": {"type": "string", "examples": ["1"]}, "vcpus": {"type": "integer", "minimum": 1}, "memory_mib": {"type": "integer", "minimum": 1}, "image_mib": {"type": "integer", "minimum": 0}, "image": {"type": "string", "examples": ["minimal", "base"]}, "created_unix_ms": {"type": "integer", "format": "int64", "minimum": 0}, "source": {"type": "string", "description": "Where its root image came from."}, "owner": {"type": ["string", "null"], "description": "The tenant a private template belongs to; null for public ones."}, "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Environment of its sandboxes' commands (an image's ENV)."}, "user": {"type": ["string", "null"], "description": "Who commands run as by default (an image's USER)."}, "workdir": {"type": ["string", "null"], "description": "Their default working directory (an image's WORKDIR)."}, "command": {"type": "array", "items": {"type": "string"}, "description": "The image's entrypoint and command (kept, not run)."}, "ports": {"type": "array", "items": {"type": "integer"}, "description": "Ports the image exposes."}, "start": {"type": ["object", "null"], "description": "The process its snapshot holds and its ready check."}}});

shape!(TemplateBuildRequest [EgressPolicy, ImageSource, Name, TemplateVersion], {"type": "object", "required": ["name"], "additionalProperties": false, "description": "Exactly one source: `image`, `from_image`, `from_archive` or `dockerfile`.", "oneOf": [{"required": ["image"]}, {"required": ["from_image"]}, {"required": ["from_archive"]}, {"required": ["dockerfile"]}], "properties": {"name": {"$ref": "#/components/schemas/Name"}, "version": {"$ref": "#/components/schemas/TemplateVersion"}, "image": {"type": "string", "description": "One of the server's stock root images.", "examples": ["minimal", "base"]}, "from_image": {"$ref": "#/components/schemas/ImageSource"}, "from_archive": {"type": "string", "description": "An upload id of an OCI or Docker archive."}, "archive_tag": {"type": "string"}, "dockerfile": {"type": "string", "description": "The Dockerfile's text."}, "context": {"type": "string", "description": "An upload id of the build context (tar, plain or gzip)."}, "build_args": {"type": "object", "additionalProperties": {"type": "string"}}, "registry": {"$ref": "#/components/schemas/ImageSource"}, "vcpus": {"type": "integer", "format": "uint32", "minimum": 1}, "memory_mib": {"type": "integer", "format": "uint64", "minimum": 1}, "disk_mib": {"type": "integer", "format": "uint64", "minimum": 1}, "start": {"type": "string", "description": "A command started before the snapshot."}, "ready_command": {"type": "string", "description": "Must exit 0 before the snapshot."}, "ready_port": {"type": "integer", "minimum": 1, "maximum": 65535, "description": "Must accept a TCP connection before the snapshot."}, "start_timeout_ms": {"type": "integer", "minimum": 0, "format": "uint64"}, "egress": {"$ref": "#/components/schemas/EgressPolicy", "description": "What a Dockerfile's RUN steps may reach (default: the default policy)."}}});

shape!(TemplateList [Template], {"type": "object", "required": ["templates"], "properties": {"templates": {"type": "array", "items": {"$ref": "#/components/schemas/Template"}}}});

shape!(Tenant [Name, Quotas], {"type": "object", "required": ["name", "created_unix_ms", "quotas"], "properties": {"name": {"$ref": "#/components/schemas/Name"}, "created_unix_ms": {"type": "integer", "format": "int64", "minimum": 0}, "quotas": {"$ref": "#/components/schemas/Quotas"}}});

shape!(TenantCreated [KeyCreated, Tenant], {"type": "object", "required": ["tenant", "key"], "properties": {"tenant": {"$ref": "#/components/schemas/Tenant"}, "key": {"$ref": "#/components/schemas/KeyCreated"}}});

shape!(TenantList [Tenant], {"type": "object", "required": ["tenants"], "properties": {"tenants": {"type": "array", "items": {"$ref": "#/components/schemas/Tenant"}}}});

shape!(TimeoutAction [], {"type": "string", "enum": ["suspend", "kill"]});

shape!(Timeouts [TimeoutAction], {"type": "object", "required": ["idle_ms", "max_lifetime_ms", "action"], "properties": {"idle_ms": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]}, "max_lifetime_ms": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]}, "action": {"$ref": "#/components/schemas/TimeoutAction"}}});

shape!(WatchEvent [], {"type": "object", "required": ["path", "kind", "is_dir"], "properties": {"path": {"type": "string"}, "kind": {"type": "string", "enum": ["created", "modified", "closed_write", "removed", "moved_from", "moved_to", "attrib", "overflow"]}, "is_dir": {"type": "boolean"}}});

shape!(EgressRule [], {"type": "string", "maxLength": 259, "description": "HOST or HOST:PORT: a DNS name whose last label is no number, `*.suffix`, `*` or an IP literal; PORT 1 to 65535 or `*` (any, the default). See docs/egress.md. The pattern is narrower than what the server takes, so that every string it admits is a rule: names of at most 8 labels (the last with a letter beyond a-f, or `-`), dotted-decimal IPv4; the server also takes any DNS name up to 253 bytes with labels up to 63, other IPv4 spellings and IPv6 (`[v6]`, `[v6]:PORT`, a bare v6).", "examples": ["pypi.org", "*.pythonhosted.org", "api.github.com:443"], "pattern": "^(\\*|(\\*\\.)?([A-Za-z0-9-]{1,24}\\.){0,7}[A-Za-z0-9-]{0,29}[G-Wg-wYZyz-][A-Za-z0-9-]{0,29}\\.?|(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])(\\.(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])){3})(:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]|\\*))?$"});

shape!(EgressPolicy [EgressRule], {"type": "object", "additionalProperties": false, "description": "Deny rules win, then allow rules, then `default`. Private destinations need an allow rule naming the host exactly.", "properties": {"default": {"type": "string", "enum": ["allow", "deny"], "default": "allow"}, "allow": {"type": "array", "items": {"$ref": "#/components/schemas/EgressRule"}, "default": []}, "deny": {"type": "array", "items": {"$ref": "#/components/schemas/EgressRule"}, "default": []}}});

shape!(SecretName [], {"type": "string", "pattern": "^[A-Z_][A-Z0-9_]{0,63}$"});

shape!(Secret [EgressRule, SecretName], {"type": "object", "required": ["name", "hosts", "created_unix_ms", "updated_unix_ms"], "description": "A secret of the vault; its value is never returned.", "properties": {"name": {"$ref": "#/components/schemas/SecretName"}, "hosts": {"type": "array", "items": {"$ref": "#/components/schemas/EgressRule"}}, "created_unix_ms": {"type": "integer", "format": "int64", "minimum": 0}, "updated_unix_ms": {"type": "integer", "format": "int64", "minimum": 0}}});

shape!(SecretList [Secret], {"type": "object", "required": ["secrets"], "properties": {"secrets": {"type": "array", "items": {"$ref": "#/components/schemas/Secret"}}}});

shape!(SecretBindingInfo [SecretName], {"type": "object", "required": ["name", "placeholder"], "properties": {"name": {"$ref": "#/components/schemas/SecretName"}, "placeholder": {"type": "string", "pattern": "^space-secret-[0-9a-f]{32}$", "description": "What the sandbox sees in the environment variable `name`; not secret."}}});

shape!(PortExposed [], {"type": "object", "required": ["port", "url", "created_unix_ms"], "properties": {"port": {"type": "integer", "minimum": 1, "maximum": 65535}, "url": {"type": "string", "description": "http(s)://<server>/ingress/<32-character token>/; shown only this once."}, "created_unix_ms": {"type": "integer", "format": "int64", "minimum": 0}}});

shape!(Port [], {"type": "object", "required": ["port", "created_unix_ms"], "properties": {"port": {"type": "integer", "minimum": 1, "maximum": 65535}, "created_unix_ms": {"type": "integer", "format": "int64", "minimum": 0}}});

shape!(PortList [Port], {"type": "object", "required": ["ports"], "properties": {"ports": {"type": "array", "items": {"$ref": "#/components/schemas/Port"}}}});

shape!(MasterKey [], {"type": "object", "required": ["provider", "id"], "description": "A tenant's master key: `deployment` (the deployment's key file) or `kms` (a key in the AWS KMS API, held by the tenant). `id` is the key's id as the archive records it.", "properties": {"provider": {"type": "string", "enum": ["deployment", "kms"]}, "key_id": {"type": "string", "description": "KMS key id, ARN or alias (kms only)."}, "region": {"type": "string", "description": "KMS region (kms only)."}, "endpoint": {"type": "string", "description": "Endpoint URL of a KMS-compatible service (kms only; default AWS's)."}, "id": {"type": ["string", "null"], "readOnly": true}}});

shape!(MasterKeySetRequest [], {"type": "object", "description": "The master key a tenant's archive key moves onto: `deployment`, or `kms` with `key_id` and `region` (and `endpoint` for a KMS-compatible service).", "oneOf": [{"type": "object", "additionalProperties": false, "required": ["provider"], "properties": {"provider": {"const": "deployment"}}}, {"type": "object", "additionalProperties": false, "required": ["provider", "key_id", "region"], "properties": {"provider": {"const": "kms"}, "key_id": {"type": "string", "minLength": 1, "maxLength": 512, "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*$", "description": "KMS key id, ARN or alias."}, "region": {"type": "string", "minLength": 1, "maxLength": 512, "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*$", "description": "KMS region."}, "endpoint": {"type": "string", "maxLength": 512, "pattern": "^https?://[^\\u0000-\\u001f\\u007f-\\u009f]*$", "description": "Endpoint URL of a KMS-compatible service (default AWS's)."}}}]});

shape!(JoinToken [], {"type": "object", "required": ["token", "id", "expires_unix_ms"], "properties": {"token": {"type": "string", "description": "`spacejoin_<id>_<secret>`, shown once; works for one join."}, "id": {"type": "string"}, "expires_unix_ms": {"type": "integer"}}});

shape!(NodeJoinRequest [], {"type": "object", "additionalProperties": false, "required": ["token", "node_id", "address", "public_key"], "properties": {"token": {"type": "string"}, "node_id": {"type": "string", "maxLength": 63}, "address": {"type": "string", "description": "host:port of the node API."}, "public_key": {"type": "string", "description": "The node's P-256 public key, uncompressed, base64."}, "report": {"type": "object", "description": "What the node has (capacity, templates, pools, sandboxes)."}}});

shape!(NodeRejoinRequest [], {"type": "object", "additionalProperties": false, "required": ["node_id", "secret", "address", "public_key"], "properties": {"node_id": {"type": "string", "maxLength": 63}, "secret": {"type": "string"}, "address": {"type": "string"}, "public_key": {"type": "string"}, "report": {"type": "object"}}});

shape!(NodeMembership [], {"type": "object", "required": ["node_id", "incarnation", "cert_pem", "not_after_unix", "ca_pem", "secret", "lease_ms", "heartbeat_ms"], "properties": {"node_id": {"type": "string"}, "incarnation": {"type": "integer"}, "cert_pem": {"type": "string"}, "not_after_unix": {"type": "integer"}, "ca_pem": {"type": "string"}, "secret": {"type": "string", "description": "The node's secret for heartbeats and rejoins."}, "lease_ms": {"type": "integer"}, "heartbeat_ms": {"type": "integer"}}});

shape!(NodeHeartbeatRequest [], {"type": "object", "additionalProperties": false, "required": ["node_id", "incarnation", "secret"], "properties": {"node_id": {"type": "string"}, "incarnation": {"type": "integer", "format": "int64"}, "secret": {"type": "string"}, "report": {"type": "object"}}});

shape!(NodeLease [], {"type": "object", "required": ["lease_ms", "state", "foreign"], "properties": {"lease_ms": {"type": "integer"}, "state": {"type": "string", "enum": ["active", "draining"]}, "foreign": {"type": "array", "items": {"type": "string"}, "description": "Sandboxes the node runs that belong to another node now: the node kills their VMs."}}});

shape!(Node [], {"type": "object", "required": ["id", "address", "incarnation", "state", "live", "lease_expires_ms", "joined_unix_ms", "accelerator", "qemu", "memory_total_mib", "memory_free_mib", "cpus", "sandboxes", "templates"], "properties": {"id": {"type": "string"}, "address": {"type": "string"}, "incarnation": {"type": "integer"}, "state": {"type": "string", "enum": ["active", "draining", "lost", "removed"]}, "live": {"type": "boolean"}, "lease_expires_ms": {"type": "integer"}, "joined_unix_ms": {"type": "integer"}, "accelerator": {"type": "string"}, "qemu": {"type": "string"}, "memory_total_mib": {"type": "integer"}, "memory_free_mib": {"type": "integer"}, "cpus": {"type": "integer"}, "sandboxes": {"type": "integer"}, "templates": {"type": "array", "items": {"type": "string"}}}});

shape!(NodeList [Node], {"type": "object", "required": ["nodes", "lease_ms", "grace_ms"], "properties": {"nodes": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}, "lease_ms": {"type": "integer"}, "grace_ms": {"type": "integer"}}});

shape!(NodeClaimRequest [], {"type": "object", "additionalProperties": false, "required": ["node_id", "incarnation", "secret", "name"], "properties": {"node_id": {"type": "string"}, "incarnation": {"type": "integer", "format": "int64"}, "secret": {"type": "string"}, "name": {"type": "string", "maxLength": 128, "description": "`template:<name>@<version>`"}, "ttl_ms": {"type": "integer", "minimum": 1000, "maximum": 1800000, "description": "How long the claim holds (1 s to 30 min; 30 min by default)."}, "release": {"type": "boolean", "description": "Give the claim up instead."}}});

shape!(NodeClaim [], {"type": "object", "required": ["held"], "properties": {"held": {"type": "boolean"}}});

shape!(ImageSource [], {"type": "object", "required": ["reference"], "additionalProperties": false, "properties": {"reference": {"type": "string", "examples": ["registry.example.com/team/python:3.12"]}, "username": {"type": "string"}, "password": {"type": "string"}, "plain_http": {"type": "boolean"}}});

shape!(Build [Template], {"type": "object", "required": ["id", "tenant", "name", "version", "source", "state", "error", "created_unix_ms", "finished_unix_ms"], "properties": {"id": {"type": "string", "examples": ["bld-0123456789abcdef"]}, "tenant": {"type": "string"}, "name": {"type": "string"}, "version": {"type": "string"}, "source": {"type": "string"}, "state": {"type": "string", "enum": ["running", "succeeded", "failed"]}, "error": {"type": ["string", "null"]}, "created_unix_ms": {"type": "integer", "minimum": 0}, "finished_unix_ms": {"type": ["integer", "null"]}, "template": {"$ref": "#/components/schemas/Template"}}});

shape!(BuildList [Build], {"type": "object", "required": ["builds"], "properties": {"builds": {"type": "array", "items": {"$ref": "#/components/schemas/Build"}}}});

shape!(Upload [], {"type": "object", "required": ["upload", "bytes"], "properties": {"upload": {"type": "string"}, "bytes": {"type": "integer", "minimum": 0}}});

shape!(SnapshotKind [], {"type": "string", "enum": ["disk", "full"]});

shape!(SnapshotId [], {"description": "`<unix ms>-<kind>-<hex>` when the node makes one; any id the node accepts is at most 64 lowercase letters, digits, `.`, `_` and `-`, starting with a letter or digit.", "examples": ["1764460000000-disk-0a1b"], "pattern": "^[a-z0-9][a-z0-9._-]{0,63}$", "type": "string"});

shape!(TemplateVersion [], {"description": "A template version: at most 64 lowercase letters, digits, `.`, `_` and `-`, starting with a letter or digit; not `latest`.", "pattern": "^[a-z0-9][a-z0-9._-]{0,63}$", "type": "string"});
