//! Accounts of the guest, from `/etc/passwd`: `GET /v1/user?name=N`, and the `username` of
//! an exec or PTY spec.

use space_proto::{Account, ErrorKind, ProtoError};

/// Where accounts are read from.
pub const PASSWD: &str = "/etc/passwd";
/// The most of `/etc/passwd` read.
const MAX_PASSWD: u64 = 1024 * 1024;
/// The longest account name accepted.
const MAX_NAME: usize = 64;

/// The account `name` of the passwd file at `path`.
pub fn lookup_in(path: &str, name: &str) -> Result<Account, ProtoError> {
    if name.is_empty()
        || name.len() > MAX_NAME
        || name.contains([':', '\n', '\0', '/'])
        || name.trim() != name
    {
        return Err(ProtoError::invalid(format!(
            "{name:?} is not an account name"
        )));
    }
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_PASSWD).read_to_string(&mut text))
        .map_err(|e| ProtoError::io(format!("reading {path}"), &e))?;
    for line in text.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 || f[0] != name {
            continue;
        }
        let (Ok(uid), Ok(gid)) = (f[2].parse::<u32>(), f[3].parse::<u32>()) else {
            continue;
        };
        return Ok(Account {
            name: name.to_owned(),
            uid,
            gid,
            home: if f[5].starts_with('/') { f[5] } else { "/" }.to_owned(),
            shell: if f[6].is_empty() { "/bin/sh" } else { f[6] }.to_owned(),
        });
    }
    Err(ProtoError::new(
        ErrorKind::NotFound,
        format!("no account {name:?} in {path}"),
    ))
}

/// The account `name` of the guest.
pub fn lookup(name: &str) -> Result<Account, ProtoError> {
    lookup_in(PASSWD, name)
}

/// Where groups are read from.
pub const GROUP: &str = "/etc/group";

/// The number of group `name` in the group file at `path`.
pub fn group_in(path: &str, name: &str) -> Result<u32, ProtoError> {
    if name.is_empty() || name.len() > MAX_NAME || name.contains([':', '\n', '\0', '/']) {
        return Err(ProtoError::invalid(format!("{name:?} is not a group name")));
    }
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_PASSWD).read_to_string(&mut text))
        .map_err(|e| ProtoError::io(format!("reading {path}"), &e))?;
    text.lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 3 && f[0] == name)
        .and_then(|f| f[2].parse().ok())
        .ok_or_else(|| ProtoError::new(ErrorKind::NotFound, format!("no group {name:?} in {path}")))
}

/// An account name or a uid, and a gid.
pub type UserSpec = (Option<String>, Option<u32>, Option<u32>);

/// Who a default user spec names (`user`, `uid`, `user:group`, `uid:gid`, as a Dockerfile's
/// `USER`): an account name or a uid, and a gid when a group is given. Groups by name are
/// looked up in `groups`.
pub fn parse_spec(spec: &str, groups: &str) -> Result<UserSpec, ProtoError> {
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let (name, uid) = match user.parse::<u32>() {
        Ok(n) => (None, Some(n)),
        // Root needs no passwd entry (an image may have none).
        Err(_) if user == "root" => (None, Some(0)),
        Err(_) => (Some(user.to_owned()), None),
    };
    let gid = match group {
        None => None,
        Some(g) => Some(match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => group_in(groups, g)?,
        }),
    };
    Ok((name, uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_specs() {
        let dir = tempfile::tempdir().unwrap();
        let groups = dir.path().join("group");
        std::fs::write(&groups, "root:x:0:\nstaff:x:50:a,b\nbad:x:zz:\n").unwrap();
        let g = groups.to_str().unwrap();
        assert_eq!(parse_spec("1000", g).unwrap(), (None, Some(1000), None));
        assert_eq!(
            parse_spec("app:staff", g).unwrap(),
            (Some("app".into()), None, Some(50))
        );
        assert_eq!(parse_spec("7:8", g).unwrap(), (None, Some(7), Some(8)));
        assert_eq!(parse_spec("root", g).unwrap(), (None, Some(0), None));
        assert_eq!(
            parse_spec("app:nope", g).unwrap_err().kind,
            ErrorKind::NotFound
        );
        assert!(parse_spec("app:bad", g).is_err());
    }

    #[test]
    fn finds_accounts_and_refuses_bad_names() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("passwd");
        std::fs::write(
            &p,
            "root:x:0:0:root:/root:/bin/bash\nbroken:x:zz:1::/:\nuser:x:1000:1000::/home/user:\nodd:x:5:6::relative:/bin/zsh\n",
        )
        .unwrap();
        let p = p.to_str().unwrap();
        let u = lookup_in(p, "user").unwrap();
        assert_eq!(
            (u.uid, u.gid, u.home.as_str(), u.shell.as_str()),
            (1000, 1000, "/home/user", "/bin/sh")
        );
        assert_eq!(lookup_in(p, "root").unwrap().uid, 0);
        assert_eq!(lookup_in(p, "odd").unwrap().home, "/");
        assert_eq!(
            lookup_in(p, "broken").unwrap_err().kind,
            ErrorKind::NotFound
        );
        assert_eq!(
            lookup_in(p, "nobody").unwrap_err().kind,
            ErrorKind::NotFound
        );
        for bad in ["", "a:b", "x\n", " user", &"u".repeat(65)] {
            assert_eq!(
                lookup_in(p, bad).unwrap_err().kind,
                ErrorKind::InvalidArgument,
                "{bad:?}"
            );
        }
    }
}
