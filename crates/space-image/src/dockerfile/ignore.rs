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

/// Whether one component matches a pattern component (`*`, `?`, `\`-escaped and literal
/// characters). Linear in practice and O(pattern × name) at worst: a `*` that fails is retried
/// only from the last `*` (any earlier one could only take less), so a pattern of many stars
/// cannot make the match exponential.
fn component_matches(pattern: &[char], name: &[char]) -> bool {
    let (mut p, mut n) = (0, 0);
    // Where the pattern goes on after the last `*`, and where in the name that `*` ends now.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() {
            match pattern[p] {
                '*' => {
                    star = Some((p + 1, n));
                    p += 1;
                    continue;
                }
                '?' => {
                    p += 1;
                    n += 1;
                    continue;
                }
                '\\' if p + 1 < pattern.len() => {
                    if pattern[p + 1] == name[n] {
                        p += 2;
                        n += 1;
                        continue;
                    }
                }
                c => {
                    if c == name[n] {
                        p += 1;
                        n += 1;
                        continue;
                    }
                }
            }
        }
        // A mismatch: the last `*` takes one more character, or nothing matches.
        let Some((after, took)) = star else {
            return false;
        };
        star = Some((after, took + 1));
        p = after;
        n = took + 1;
    }
    pattern[p..].iter().all(|c| *c == '*')
}

/// Whether `pattern` matches `path` or one of its parent directories. A table of which
/// pattern suffix matches which path suffix, so that many `**` stay polynomial.
fn matches(pattern: &[String], path: &[String]) -> bool {
    let (np, nn) = (pattern.len(), path.len());
    let chars: Vec<Vec<char>> = pattern.iter().map(|p| p.chars().collect()).collect();
    let names: Vec<Vec<char>> = path.iter().map(|n| n.chars().collect()).collect();
    // next[j]: pattern[i + 1..] matches path[j..]; the pattern used up matched a parent, so
    // everything under it is covered.
    let mut next = vec![true; nn + 1];
    for i in (0..np).rev() {
        let mut here = vec![false; nn + 1];
        if pattern[i] == "**" {
            // Any number of components: path[j..] for any j' ≥ j.
            let mut any = false;
            for j in (0..=nn).rev() {
                any |= next[j];
                here[j] = any;
            }
        } else {
            for j in 0..nn {
                here[j] = next[j + 1] && component_matches(&chars[i], &names[j]);
            }
        }
        next = here;
    }
    next[0]
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

    /// The definition the matcher must agree with, by plain backtracking (exponential in the
    /// number of stars, so only for short inputs).
    fn component_by_definition(pattern: &[char], name: &[char]) -> bool {
        match (pattern.first(), name.first()) {
            (None, None) => true,
            (Some('*'), _) => {
                component_by_definition(&pattern[1..], name)
                    || (!name.is_empty() && component_by_definition(pattern, &name[1..]))
            }
            (Some('?'), Some(_)) => component_by_definition(&pattern[1..], &name[1..]),
            (Some('\\'), Some(n)) if pattern.len() > 1 => {
                pattern[1] == *n && component_by_definition(&pattern[2..], &name[1..])
            }
            (Some(p), Some(n)) => p == n && component_by_definition(&pattern[1..], &name[1..]),
            _ => false,
        }
    }

    fn paths_by_definition(pattern: &[String], path: &[String]) -> bool {
        match pattern.first() {
            None => true,
            Some(p) if p == "**" => {
                (0..=path.len()).any(|k| paths_by_definition(&pattern[1..], &path[k..]))
            }
            Some(p) => match path.first() {
                Some(name) => {
                    let (pc, nc): (Vec<char>, Vec<char>) =
                        (p.chars().collect(), name.chars().collect());
                    component_by_definition(&pc, &nc)
                        && paths_by_definition(&pattern[1..], &path[1..])
                }
                None => false,
            },
        }
    }

    #[test]
    fn the_matcher_agrees_with_the_definition() {
        // Every pattern and name of up to 5 characters over a small alphabet.
        fn all(alphabet: &[char], max: usize) -> Vec<Vec<char>> {
            let mut out = vec![Vec::new()];
            let mut last = vec![Vec::new()];
            for _ in 0..max {
                let mut grown = Vec::new();
                for w in &last {
                    for c in alphabet {
                        let mut w = w.clone();
                        w.push(*c);
                        grown.push(w);
                    }
                }
                out.extend(grown.iter().cloned());
                last = grown;
            }
            out
        }
        let names = all(&['a', 'b', '*', '\\'], 4);
        for pattern in all(&['a', '*', '?', '\\'], 5) {
            for name in &names {
                assert_eq!(
                    component_matches(&pattern, name),
                    component_by_definition(&pattern, name),
                    "{pattern:?} against {name:?}"
                );
            }
        }
        let parts = ["**", "a", "*", "b"];
        let paths = [
            vec![],
            vec!["a"],
            vec!["a", "b"],
            vec!["b", "a", "b"],
            vec!["a", "a", "b", "c"],
        ];
        for n in 0..=4 {
            for code in 0..parts.len().pow(n) {
                let pattern: Vec<String> = (0..n)
                    .map(|k| parts[code / parts.len().pow(k) % parts.len()].to_owned())
                    .collect();
                for path in &paths {
                    let path: Vec<String> = path.iter().map(|s| s.to_string()).collect();
                    assert_eq!(
                        matches(&pattern, &path),
                        paths_by_definition(&pattern, &path),
                        "{pattern:?} against {path:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn many_stars_are_matched_without_backtracking_blowing_up() {
        // Found by the fuzzer: a line of stars took minutes against a path.
        let stars = "*".repeat(200);
        let ig = Ignore::parse(&format!("{stars}x\n{}z", "**/".repeat(60)));
        assert!(!ig.is_ignored(&"a".repeat(300)));
        assert!(ig.is_ignored(&format!("{}x", "a".repeat(300))));
        let deep = vec!["d"; 60].join("/");
        assert!(!ig.is_ignored(&deep));
        assert!(ig.is_ignored(&format!("{deep}/z")));
    }
}
