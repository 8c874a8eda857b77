//! Dockerfiles: the instructions a template build runs.
//!
//! Supported: `FROM`, `RUN`, `COPY` and `ADD` (local paths; `--chown`, `--chmod`), `ENV`,
//! `ARG`, `WORKDIR`, `USER`, `EXPOSE`, `ENTRYPOINT`, `CMD`; comments, line continuations and
//! the `escape` directive; `$VAR`, `${VAR}`, `${VAR:-default}` and `${VAR:+alt}` in the
//! instructions Docker expands them in. Anything else (another instruction, a second `FROM`,
//! heredocs, `--mount`, an ADD of a URL) is an error that names its line, before anything
//! runs.

pub mod ignore;

use std::collections::BTreeMap;

/// Largest Dockerfile read.
pub const MAX_DOCKERFILE: usize = 1 << 20;

/// A parse error, with the 1-based line it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Dockerfile line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

fn err<T>(line: usize, message: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError {
        line,
        message: message.into(),
    })
}

/// A command: the shell form runs under `/bin/sh -c`, the exec form as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Shell(String),
    Exec(Vec<String>),
}

/// One instruction, variables expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Run(Command),
    Copy {
        sources: Vec<String>,
        dest: String,
        chown: Option<String>,
        chmod: Option<u32>,
        /// `ADD` rather than `COPY`.
        add: bool,
    },
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
    Expose(Vec<String>),
    Entrypoint(Command),
    Cmd(Command),
}

/// A parsed Dockerfile: its base and its steps, each with its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dockerfile {
    /// The `FROM` image (a template name or an image reference), expanded.
    pub from: String,
    pub from_line: usize,
    pub steps: Vec<(usize, Step)>,
    /// The source text of each step (for cache keys and logs), by the step's line.
    pub texts: BTreeMap<usize, String>,
}

/// Joins continuation lines; answers (first line number, instruction text) pairs.
fn logical_lines(text: &str) -> Result<(Vec<(usize, String)>, char), ParseError> {
    let mut escape = '\\';
    let mut lines = text.lines().enumerate().peekable();
    // Parser directives: `# key=value` lines at the very top.
    while let Some((_, l)) = lines.peek() {
        let t = l.trim();
        let Some(d) = t.strip_prefix('#') else { break };
        let Some((k, v)) = d.split_once('=') else {
            break;
        };
        match k.trim().to_ascii_lowercase().as_str() {
            "escape" => {
                escape = match v.trim() {
                    "\\" => '\\',
                    "`" => '`',
                    other => {
                        return err(
                            1,
                            format!("the escape directive takes \\ or `, not {other:?}"),
                        )
                    }
                };
            }
            "syntax" | "check" => {}
            _ => break,
        }
        lines.next();
    }
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, raw) in lines {
        let n = i + 1;
        let trimmed = raw.trim();
        if current.is_none() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if current.is_some() && trimmed.starts_with('#') {
            // Comment lines inside a continuation are dropped.
            continue;
        }
        let (body, continues) = match trimmed.strip_suffix(escape) {
            Some(b) => (b, true),
            None => (trimmed, false),
        };
        match &mut current {
            Some((_, text)) => {
                text.push(' ');
                text.push_str(body.trim());
            }
            None => current = Some((n, body.trim().to_owned())),
        }
        if !continues {
            out.extend(current.take());
        }
    }
    if let Some((n, _)) = current {
        return err(n, "the instruction ends with a line continuation");
    }
    Ok((out, escape))
}

/// `["a", "b"]` as the exec form, anything else as the shell form (as Docker reads it).
fn command(rest: &str) -> Command {
    if rest.trim_start().starts_with('[') {
        if let Ok(v) = serde_json::from_str::<Vec<String>>(rest.trim()) {
            return Command::Exec(v);
        }
    }
    Command::Shell(rest.to_owned())
}

/// Splits words on whitespace, honouring double and single quotes and the escape char.
fn words(s: &str, escape: char, line: usize) -> Result<Vec<String>, ParseError> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (Some(q), c) if c == q => quote = None,
            (q, c) if c == escape && q != Some('\'') => {
                in_word = true;
                match chars.next() {
                    Some(n) => cur.push(n),
                    None => cur.push(c),
                }
            }
            (_, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return err(line, "a quote is not closed");
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// Expands `$VAR`, `${VAR}`, `${VAR:-default}` and `${VAR:+alt}` from `vars` (unset is empty).
pub fn expand(s: &str, vars: &BTreeMap<String, String>, line: usize) -> Result<String, ParseError> {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() && b[i + 1] == b'$' {
            out.push('$');
            i += 2;
            continue;
        }
        if b[i] != b'$' {
            let ch = s[i..].chars().next().expect("a char at a char boundary");
            out.push(ch);
            i += ch.len_utf8();
            continue;
        }
        if i + 1 < b.len() && b[i + 1] == b'{' {
            let Some(end) = s[i + 2..].find('}') else {
                return err(line, format!("an unclosed ${{ in {s:?}"));
            };
            let inner = &s[i + 2..i + 2 + end];
            let (name, op) = match inner.find(':') {
                Some(k) => (&inner[..k], Some(&inner[k..])),
                None => (inner, None),
            };
            if !valid_name(name) {
                return err(line, format!("a bad variable name in ${{{inner}}}"));
            }
            let value = vars.get(name).filter(|v| !v.is_empty());
            match op {
                None => out.push_str(value.map_or("", String::as_str)),
                Some(o) if o.starts_with(":-") => match value {
                    Some(v) => out.push_str(v),
                    None => out.push_str(&expand(&o[2..], vars, line)?),
                },
                Some(o) if o.starts_with(":+") => {
                    if value.is_some() {
                        out.push_str(&expand(&o[2..], vars, line)?);
                    }
                }
                Some(o) => return err(line, format!("the modifier {o:?} is not supported")),
            }
            i += 3 + end;
            continue;
        }
        let start = i + 1;
        let mut j = start;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        if j == start {
            out.push('$');
            i += 1;
            continue;
        }
        out.push_str(vars.get(&s[start..j]).map_or("", String::as_str));
        i = j;
    }
    Ok(out)
}

fn valid_name(n: &str) -> bool {
    let mut c = n.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// `KEY=VALUE ...` pairs, or the old `KEY VALUE` form.
fn pairs(
    rest: &str,
    escape: char,
    line: usize,
    what: &str,
) -> Result<Vec<(String, String)>, ParseError> {
    let ws = words(rest, escape, line)?;
    if ws.is_empty() {
        return err(line, format!("{what} needs a name"));
    }
    if !ws[0].contains('=') {
        // `ENV KEY the value`: the rest of the line is the value.
        let key = ws[0].clone();
        let value = rest.trim_start()[rest
            .trim_start()
            .find(char::is_whitespace)
            .unwrap_or(rest.trim_start().len())..]
            .trim();
        if !valid_name(&key) {
            return err(line, format!("{key:?} is not a variable name"));
        }
        return Ok(vec![(key, words(value, escape, line)?.join(" "))]);
    }
    ws.into_iter()
        .map(|w| {
            let (k, v) = w.split_once('=').ok_or_else(|| ParseError {
                line,
                message: format!("{what} takes KEY=VALUE pairs, and {w:?} is not one"),
            })?;
            if !valid_name(k) {
                return err(line, format!("{k:?} is not a variable name"));
            }
            Ok((k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// Parses `text` with the build arguments `args` (`--build-arg`), which only set names an
/// `ARG` declares.
pub fn parse(text: &str, args: &BTreeMap<String, String>) -> Result<Dockerfile, ParseError> {
    if text.len() > MAX_DOCKERFILE {
        return err(
            1,
            format!("the Dockerfile is larger than {MAX_DOCKERFILE} bytes"),
        );
    }
    let (lines, escape) = logical_lines(text)?;
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut from: Option<(usize, String)> = None;
    let mut steps = Vec::new();
    let mut texts = BTreeMap::new();
    for (n, text) in lines {
        let (word, rest) = match text.split_once(char::is_whitespace) {
            Some((w, r)) => (w, r.trim()),
            None => (text.as_str(), ""),
        };
        let instruction = word.to_ascii_uppercase();
        let heredoc = rest.split_whitespace().any(|w| {
            w.strip_prefix("<<").is_some_and(|t| {
                t.trim_start_matches('-')
                    .trim_start_matches(['"', '\''])
                    .starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            })
        });
        if heredoc && matches!(instruction.as_str(), "RUN" | "COPY" | "ADD") {
            return err(n, "heredocs are not supported; write the file with COPY");
        }
        if from.is_none() && !matches!(instruction.as_str(), "FROM" | "ARG") {
            return err(n, format!("{instruction} comes before FROM"));
        }
        let mut flags = Vec::new();
        let mut rest = rest;
        while let Some(f) = rest.strip_prefix("--") {
            let end = f.find(char::is_whitespace).unwrap_or(f.len());
            flags.push(f[..end].to_owned());
            rest = f[end..].trim_start();
        }
        let flag = |name: &str| -> Option<String> {
            flags
                .iter()
                .find_map(|f| f.strip_prefix(&format!("{name}=")).map(str::to_owned))
        };
        let allowed: &[&str] = match instruction.as_str() {
            "COPY" | "ADD" => &["chown", "chmod"],
            _ => &[],
        };
        for f in &flags {
            let name = f.split('=').next().unwrap_or("");
            if !allowed.contains(&name) {
                return err(n, format!("{instruction} --{name} is not supported"));
            }
        }
        let step = match instruction.as_str() {
            "FROM" => {
                if from.is_some() {
                    return err(n, "a second FROM: multi-stage builds are not supported");
                }
                let ws = words(rest, escape, n)?;
                let image = match ws.as_slice() {
                    [image] => image.clone(),
                    [image, as_, _] if as_.eq_ignore_ascii_case("as") => image.clone(),
                    _ => return err(n, "FROM takes one image (FROM name [AS stage])"),
                };
                from = Some((n, expand(&image, &vars, n)?));
                continue;
            }
            "ARG" => {
                for (name, default) in words(rest, escape, n)?.iter().map(|w| match w.split_once('=') {
                    Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
                    None => (w.clone(), None),
                }) {
                    if !valid_name(&name) {
                        return err(n, format!("{name:?} is not a variable name"));
                    }
                    let value = match (args.get(&name), default) {
                        (Some(v), _) => v.clone(),
                        (None, Some(d)) => expand(&d, &vars, n)?,
                        (None, None) => String::new(),
                    };
                    vars.insert(name, value);
                }
                continue;
            }
            "RUN" => Step::Run(command(rest)),
            "CMD" => Step::Cmd(command(rest)),
            "ENTRYPOINT" => Step::Entrypoint(command(rest)),
            "ENV" => {
                let mut set = Vec::new();
                for (k, v) in pairs(rest, escape, n, "ENV")? {
                    let v = expand(&v, &vars, n)?;
                    vars.insert(k.clone(), v.clone());
                    set.push((k, v));
                }
                Step::Env(set)
            }
            "WORKDIR" => {
                let ws = words(rest, escape, n)?;
                let [dir] = ws.as_slice() else {
                    return err(n, "WORKDIR takes one path");
                };
                Step::Workdir(expand(dir, &vars, n)?)
            }
            "USER" => {
                let ws = words(rest, escape, n)?;
                let [user] = ws.as_slice() else {
                    return err(n, "USER takes one user[:group]");
                };
                Step::User(expand(user, &vars, n)?)
            }
            "EXPOSE" => {
                let ports: Vec<String> = words(rest, escape, n)?
                    .iter()
                    .map(|p| expand(p, &vars, n))
                    .collect::<Result<_, _>>()?;
                for p in &ports {
                    let (num, proto) = p.split_once('/').unwrap_or((p, "tcp"));
                    if num.parse::<u16>().map_or(true, |v| v == 0) || !matches!(proto, "tcp" | "udp") {
                        return err(n, format!("EXPOSE {p:?} is not a port[/tcp|/udp]"));
                    }
                }
                Step::Expose(ports)
            }
            "COPY" | "ADD" => {
                let mut ws: Vec<String> = match command(rest) {
                    Command::Exec(v) => v,
                    Command::Shell(s) => words(&s, escape, n)?,
                };
                if ws.len() < 2 {
                    return err(n, format!("{instruction} takes sources and a destination"));
                }
                for w in ws.iter_mut() {
                    *w = expand(w, &vars, n)?;
                }
                let dest = ws.pop().expect("two or more words");
                if instruction == "ADD" {
                    if let Some(url) = ws.iter().find(|s| s.contains("://")) {
                        return err(n, format!("ADD {url}: only local paths are supported"));
                    }
                }
                let chmod = match flag("chmod") {
                    Some(m) => Some(u32::from_str_radix(&m, 8).ok().filter(|m| *m <= 0o7777).ok_or_else(|| ParseError {
                        line: n,
                        message: format!("--chmod={m} is not an octal mode"),
                    })?),
                    None => None,
                };
                Step::Copy {
                    sources: ws,
                    dest,
                    chown: flag("chown").map(|c| expand(&c, &vars, n)).transpose()?,
                    chmod,
                    add: instruction == "ADD",
                }
            }
            other => {
                return err(
                    n,
                    format!("{other} is not supported (FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, EXPOSE, ENTRYPOINT, CMD are)"),
                )
            }
        };
        texts.insert(n, text.clone());
        steps.push((n, step));
    }
    let Some((from_line, from)) = from else {
        return err(1, "there is no FROM");
    };
    Ok(Dockerfile {
        from,
        from_line,
        steps,
        texts,
    })
}

#[cfg(test)]
mod tests;
