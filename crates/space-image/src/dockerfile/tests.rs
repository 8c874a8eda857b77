use super::*;

fn no_args() -> BTreeMap<String, String> {
    BTreeMap::new()
}

#[test]
fn a_dockerfile_parses_into_steps_with_variables_expanded() {
    let text = r#"# syntax=docker/dockerfile:1
ARG BASE=base
FROM ${BASE}
ARG VERSION=1.2
ENV APP_HOME=/srv/app \
    MODE="fast mode"
# a comment between instructions
WORKDIR $APP_HOME
COPY --chown=user:user --chmod=755 src/ run.sh ${APP_HOME}/
ADD ["data file.txt", "/data/"]
RUN apt-get update && \
    # a comment inside a continuation
    apt-get install -y curl
USER user
EXPOSE 8000 9000/udp
ENV LEGACY the old form
ENTRYPOINT ["/srv/app/run.sh"]
CMD python3 -m http.server ${VERSION:+--bind} ${UNSET:-8000}
"#;
    let d = parse(text, &no_args()).unwrap();
    assert_eq!((d.from.as_str(), d.from_line), ("base", 3));
    let steps: Vec<&Step> = d.steps.iter().map(|(_, s)| s).collect();
    assert_eq!(
        steps[0],
        &Step::Env(vec![
            ("APP_HOME".into(), "/srv/app".into()),
            ("MODE".into(), "fast mode".into())
        ])
    );
    assert_eq!(steps[1], &Step::Workdir("/srv/app".into()));
    assert_eq!(
        steps[2],
        &Step::Copy {
            sources: vec!["src/".into(), "run.sh".into()],
            dest: "/srv/app/".into(),
            chown: Some("user:user".into()),
            chmod: Some(0o755),
            add: false,
        }
    );
    assert_eq!(
        steps[3],
        &Step::Copy {
            sources: vec!["data file.txt".into()],
            dest: "/data/".into(),
            chown: None,
            chmod: None,
            add: true,
        }
    );
    assert_eq!(
        steps[4],
        &Step::Run(Command::Shell(
            "apt-get update && apt-get install -y curl".into()
        ))
    );
    assert_eq!(steps[5], &Step::User("user".into()));
    assert_eq!(
        steps[6],
        &Step::Expose(vec!["8000".into(), "9000/udp".into()])
    );
    assert_eq!(
        steps[7],
        &Step::Env(vec![("LEGACY".into(), "the old form".into())])
    );
    assert_eq!(
        steps[8],
        &Step::Entrypoint(Command::Exec(vec!["/srv/app/run.sh".into()]))
    );
    // CMD is not expanded by the builder: the shell does that when it runs.
    assert_eq!(
        steps[9],
        &Step::Cmd(Command::Shell(
            "python3 -m http.server ${VERSION:+--bind} ${UNSET:-8000}".into()
        ))
    );
    // The RUN's line is its first line; its text is kept for cache keys and logs.
    assert_eq!(d.steps[4].0, 11);
    assert!(d.texts[&11].starts_with("RUN apt-get update"));

    // A build argument replaces an ARG's default.
    let args = BTreeMap::from([("BASE".to_owned(), "python-dev".to_owned())]);
    assert_eq!(parse(text, &args).unwrap().from, "python-dev");
    assert_eq!(
        expand(
            "${VERSION:-none}-$VERSION-\\$HOME",
            &BTreeMap::from([("VERSION".into(), "2".into())]),
            1
        )
        .unwrap(),
        "2-2-$HOME"
    );
}

#[test]
fn what_is_not_supported_is_an_error_naming_its_line() {
    for (text, line, needle) in [
        (
            "FROM base\nHEALTHCHECK CMD true\n",
            2,
            "HEALTHCHECK is not supported",
        ),
        ("FROM base\nRUN true\nFROM other\n", 3, "multi-stage"),
        (
            "FROM base\nCOPY --from=build /a /b\n",
            2,
            "--from is not supported",
        ),
        (
            "FROM base\nRUN --mount=type=cache,target=/x true\n",
            2,
            "--mount is not supported",
        ),
        (
            "FROM base\nADD https://example.com/x.tgz /x\n",
            2,
            "only local paths",
        ),
        ("FROM base\nRUN <<EOF\necho hi\nEOF\n", 2, "heredocs"),
        ("RUN true\n", 1, "before FROM"),
        ("# just a comment\n", 1, "no FROM"),
        ("FROM base\nCOPY onlyone\n", 2, "sources and a destination"),
        ("FROM base\nEXPOSE 99999\n", 2, "not a port"),
        ("FROM base\nENV 1BAD=x\n", 2, "not a variable name"),
        ("FROM base\nWORKDIR ${OOPS\n", 2, "unclosed"),
        ("FROM base\nRUN echo \\\n", 2, "line continuation"),
        ("FROM base\nCOPY --chmod=999 a b\n", 2, "octal"),
    ] {
        let e = parse(text, &no_args()).unwrap_err();
        assert_eq!(e.line, line, "{text:?}: {e}");
        assert!(e.to_string().contains(needle), "{text:?}: {e}");
    }
    // `<<` that is not a heredoc (a shell redirect of a number, a comparison) is fine.
    assert!(parse("FROM base\nRUN echo $((1 << 2))\n", &no_args()).is_ok());
}

#[test]
fn the_escape_directive_changes_the_continuation_character() {
    let d = parse(
        "# escape=`\nFROM base\nRUN echo a `\n  b\nCOPY C:\\a b\n",
        &no_args(),
    )
    .unwrap();
    assert_eq!(d.steps[0].1, Step::Run(Command::Shell("echo a b".into())));
}
