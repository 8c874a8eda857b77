//! The client commands: each turns its arguments into API calls and prints the answer.

mod admin;
mod exec;
mod files;
mod mcp;
mod net;
mod profile;
mod sandbox;
mod shell;
mod templates;
mod top;
mod volumes;

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use serde_json::Value;

use crate::cli::Command;
use crate::config;

/// Runs a client command; returns the process exit code.
pub async fn run(command: Command, json: bool) -> Result<i32> {
    if let Command::Profile(cmd) = command {
        profile::profile(cmd, json)?;
        return Ok(0);
    }
    let client = crate::client::connect(&config::load()?)?;
    let c = &client;
    match command {
        Command::Node(crate::cli::NodeArgs { cmd: Some(cmd), .. }) => {
            admin::node(c, cmd, json).await?
        }
        Command::Profile(_) => unreachable!("handled above"),
        Command::Up(_)
        | Command::Control(_)
        | Command::Node(_)
        | Command::Purge(_)
        | Command::AdminKey(_) => {
            unreachable!("server roles are dispatched in main")
        }
        Command::Template(cmd) => templates::template(c, cmd, json).await?,
        Command::Create(args) => sandbox::create(c, args, json).await?,
        Command::Ls(args) => sandbox::ls(c, args, json).await?,
        Command::Info(a) => sandbox::info(c, &a.id, json).await?,
        Command::Exec(args) => return exec::exec(c, args).await,
        Command::Shell(args) => return shell::shell(c, args).await,
        Command::Cp(args) => files::cp(c, args).await?,
        Command::Pause(a) => sandbox::transition(c, &a.id, "pause", "paused", json).await?,
        Command::Resume(a) => sandbox::transition(c, &a.id, "resume", "resumed", json).await?,
        Command::Suspend(a) => sandbox::transition(c, &a.id, "suspend", "suspended", json).await?,
        Command::Restore(a) => sandbox::transition(c, &a.id, "restore", "restored", json).await?,
        Command::Kill(a) => sandbox::kill(c, &a.id, json).await?,
        Command::Fork(a) => sandbox::fork(c, &a.id, json).await?,
        Command::Snapshot(args) => sandbox::snapshot(c, args, json).await?,
        Command::Snapshots(a) => sandbox::snapshots(c, &a.id, json).await?,
        Command::Rollback(args) => sandbox::rollback(c, args, json).await?,
        Command::Timeout(args) => sandbox::timeout(c, args, json).await?,
        Command::Logs(args) => sandbox::logs(c, args).await?,
        Command::Metrics(args) => top::metrics(c, args, json).await?,
        Command::Top(args) => top::top(c, args, json).await?,
        Command::Audit(args) => admin::audit(c, args, json).await?,
        Command::Tenant(cmd) => admin::tenant(c, cmd, json).await?,
        Command::Key(cmd) => admin::key(c, cmd, json).await?,
        Command::Secret(cmd) => net::secret(c, cmd, json).await?,
        Command::Volume(cmd) => volumes::volume(c, cmd, json).await?,
        Command::Net(args) => net::net(c, args, json).await?,
        Command::Expose(args) => net::expose(c, args, json).await?,
        Command::Browser(args) => net::browser(c, args, json).await?,
        Command::Unexpose(a) => net::unexpose(c, &a.id, a.port, json).await?,
        Command::Mcp(args) => mcp::serve(c, args).await?,
    }
    Ok(0)
}

/// Parses repeated `K=V` arguments into a map (a later K wins).
pub fn pairs(args: &[String], what: &str) -> Result<BTreeMap<String, String>> {
    let mut map = BTreeMap::new();
    for a in args {
        match a.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                map.insert(k.to_owned(), v.to_owned());
            }
            _ => bail!("{what} {a:?} is not K=V"),
        }
    }
    Ok(map)
}

/// Parses `SECS` or `never` into milliseconds as JSON (`never` is null).
pub fn secs_or_never(arg: &str, what: &str) -> Result<Value> {
    if arg.eq_ignore_ascii_case("never") {
        return Ok(Value::Null);
    }
    match arg.parse::<u64>() {
        Ok(s) if s > 0 && s <= u64::MAX / 1000 => Ok(Value::from(s * 1000)),
        _ => bail!("{what} {arg:?} is neither a positive number of seconds nor `never`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_and_durations_parse_or_explain() {
        let m = pairs(&["A=1".into(), "B=x=y".into(), "A=2".into()], "--env").unwrap();
        assert_eq!(m.get("A").map(String::as_str), Some("2"));
        assert_eq!(m.get("B").map(String::as_str), Some("x=y"));
        assert!(pairs(&["=1".into()], "--env").is_err());
        assert!(pairs(&["novalue".into()], "--env").is_err());
        assert_eq!(
            secs_or_never("60", "--idle").unwrap(),
            Value::from(60_000u64)
        );
        assert_eq!(secs_or_never("never", "--idle").unwrap(), Value::Null);
        assert!(secs_or_never("0", "--idle").is_err());
        assert!(secs_or_never("-5", "--idle").is_err());
    }
}
