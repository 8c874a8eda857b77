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

#[cfg(test)]
mod tests {
    use super::*;

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
