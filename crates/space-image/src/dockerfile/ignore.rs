//! `.dockerignore`: which files of a build context a build may not see.
//!
//! One pattern a line; `#` starts a comment line; a leading `!` makes an exception; the last
//! pattern that matches a path decides. Patterns are paths relative to the context (a leading
//! `/` or `./` is dropped, `.` and `..` are cleaned): `*` matches within one path component,
//! `?` one character, `**` any number of components, and a pattern that matches a directory
//! covers everything under it.

/// The patterns of a `.dockerignore`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ignore {
    rules: Vec<(bool, Vec<String>)>,
}

fn clean(path: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c.to_owned()),
        }
    }
    out
}

/// Whether one component matches a pattern component (`*`, `?`, literal characters).
fn component_matches(pattern: &[char], name: &[char]) -> bool {
    match (pattern.first(), name.first()) {
        (None, None) => true,
        (Some('*'), _) => {
            component_matches(&pattern[1..], name)
                || (!name.is_empty() && component_matches(pattern, &name[1..]))
        }
        (Some('?'), Some(_)) => component_matches(&pattern[1..], &name[1..]),
        (Some('\\'), Some(n)) if pattern.len() > 1 => {
            pattern[1] == *n && component_matches(&pattern[2..], &name[1..])
        }
        (Some(p), Some(n)) => p == n && component_matches(&pattern[1..], &name[1..]),
        _ => false,
    }
}

/// Whether `pattern` matches `path` or one of its parent directories.
fn matches(pattern: &[String], path: &[String]) -> bool {
    match pattern.first() {
        None => true, // the pattern matched a parent: everything under it is covered
        Some(p) if p == "**" => (0..=path.len()).any(|k| matches(&pattern[1..], &path[k..])),
        Some(p) => match path.first() {
            Some(name) => {
                let (pc, nc): (Vec<char>, Vec<char>) =
                    (p.chars().collect(), name.chars().collect());
                component_matches(&pc, &nc) && matches(&pattern[1..], &path[1..])
            }
            None => false,
        },
    }
}

impl Ignore {
    /// Reads a `.dockerignore`.
    pub fn parse(text: &str) -> Ignore {
        let mut rules = Vec::new();
        for line in text.lines() {
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let (keep, pattern) = match l.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, l),
            };
            let parts = clean(pattern);
            if !parts.is_empty() {
                rules.push((keep, parts));
            }
        }
        Ignore { rules }
    }

    /// Whether `path` (relative to the context) is left out of the build.
    pub fn is_ignored(&self, path: &str) -> bool {
        let path = clean(path);
        let mut ignored = false;
        for (keep, pattern) in &self.rules {
            if matches(pattern, &path) {
                ignored = !keep;
            }
        }
        ignored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_exceptions_and_directories() {
        let ig = Ignore::parse(
            "# build output\n/target\n*.log\n**/node_modules\n!keep.log\ndocs/*.md\n!docs/README.md\nsecret?.txt\n",
        );
        for (path, want) in [
            ("target", true),
            ("target/debug/app", true),
            ("src/target", false),
            ("app.log", true),
            ("keep.log", false),
            ("sub/app.log", false),
            ("a/b/node_modules/x/index.js", true),
            ("node_modules", true),
            ("docs/guide.md", true),
            ("docs/README.md", false),
            ("docs/deep/guide.md", false),
            ("secret1.txt", true),
            ("secret12.txt", false),
            ("./src/../app.log", true),
            ("src/main.rs", false),
        ] {
            assert_eq!(ig.is_ignored(path), want, "{path}");
        }
        assert!(!Ignore::parse("").is_ignored("anything"));
    }
}
