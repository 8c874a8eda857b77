//! Entry point of `space-guestd`; see the library for what it does.

fn main() {
    let opts = match space_guestd::Options::parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    let pid1 = std::process::id() == 1;
    if pid1 {
        // Before logging or opening anything: descriptors 0-2 must exist.
        space_guestd::init::ensure_std_fds();
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("SPACE_GUESTD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .init();
    if pid1 {
        space_guestd::init::setup();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    loop {
        match runtime.block_on(space_guestd::daemon::run(opts.clone(), pid1)) {
            Ok(()) => return,
            Err(e) => {
                tracing::error!(
                    "{e}: {}",
                    std::error::Error::source(&e)
                        .map(|s| s.to_string())
                        .unwrap_or_default()
                );
                if !pid1 {
                    std::process::exit(1);
                }
                // PID 1 must not exit: that would panic the kernel. Try again shortly.
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
    }
}
